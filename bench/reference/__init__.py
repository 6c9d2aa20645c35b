"""The reference for bench/transactional.py: the least a Django app accepting a message can do."""

# The reference's one table, created by bench/transactional.py before each run.
TABLE_SQL = """
CREATE TABLE IF NOT EXISTS reference_message (
    id bigserial PRIMARY KEY,
    to_email varchar(254) NOT NULL,
    subject varchar(998) NOT NULL,
    html text,
    text text,
    priority varchar(10) NOT NULL,
    created_at timestamptz NOT NULL DEFAULT statement_timestamp()
)
"""
