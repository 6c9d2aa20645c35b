"""Create the database named by DATABASE_URL if it does not exist (used by `make`)."""

from __future__ import annotations

import os
import sys

import psycopg2
from psycopg2 import sql

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from emailhub.env import env_database_url  # noqa: E402


def main() -> int:
    db = env_database_url("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/emailhub")
    try:
        connection = psycopg2.connect(
            dbname="postgres", user=db["USER"], password=db["PASSWORD"], host=db["HOST"], port=db["PORT"]
        )
    except psycopg2.OperationalError as exc:
        print(
            f"cannot reach PostgreSQL at {db['HOST']}:{db['PORT']} as {db['USER']}: {exc}\n"
            "Start PostgreSQL or set DATABASE_URL (postgres://user:password@host:port/dbname).",
            file=sys.stderr,
        )
        return 1
    connection.autocommit = True
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]])
        if cursor.fetchone() is None:
            cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(db["NAME"]))))
            print(f"created database {db['NAME']}")
    connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
