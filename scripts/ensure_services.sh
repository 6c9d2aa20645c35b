#!/usr/bin/env bash
# Start PostgreSQL and Redis on this machine if they are installed here but not running.
set -u
pg_up() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
redis_up() { (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; }

if ! pg_up; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
  fi
  for _ in $(seq 1 30); do pg_up && break; sleep 0.5; done
  pg_up || { echo "PostgreSQL is not reachable on 127.0.0.1:5432; start it or set DATABASE_URL" >&2; exit 1; }
fi
if ! redis_up; then
  if command -v redis-server >/dev/null 2>&1; then
    echo "starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
  fi
  for _ in $(seq 1 30); do redis_up && break; sleep 0.2; done
  redis_up || { echo "Redis is not reachable on 127.0.0.1:6379; start it or set REDIS_URL" >&2; exit 1; }
fi
exit 0
