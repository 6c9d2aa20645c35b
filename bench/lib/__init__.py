"""What the benchmarks share; each entry script of bench/ (a file with a `main`) imports from
here and never from another entry script (tests/test_bench_layout.py):

- common: a database and Redis database of the bench's own, migrated (and claimed), the log
  directory, client threads;
- stats: percentiles, a process group's peak RSS and CPU time;
- api: message bodies, posting them through the HTTP API, waiting until they are sent;
- audience: a generated contact list, the newsletter template, the reset between runs;
- fanout_process: the fresh process that times one fan-out (bench/fanout.py --child);
- smtp_sink: Postfix's smtp-sink (or aiosmtpd) for the benches that send;
- post_office: the django-post_office reference of bench/campaign.py --compare.
"""
