#!/bin/sh
# The `postgres` service of docker-compose.replicas.yml and of the Swarm stack. On an empty
# data volume it makes the cluster: a `bae` role with the password in POSTGRES_PASSWORD, or
# in the file POSTGRES_PASSWORD_FILE names (a Docker secret), never in the image; it reaches
# the server through psql's \getenv, so it is on no command line and in no log. The role
# owns the `bae` database. Then it runs the server.
set -eu

if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    if [ -n "${POSTGRES_PASSWORD:-}" ]; then
        echo "postgres-entrypoint: POSTGRES_PASSWORD and POSTGRES_PASSWORD_FILE are both set; set one of them" >&2
        exit 1
    fi
    if [ ! -r "$POSTGRES_PASSWORD_FILE" ]; then
        echo "postgres-entrypoint: cannot read POSTGRES_PASSWORD_FILE ($POSTGRES_PASSWORD_FILE)" >&2
        exit 1
    fi
    POSTGRES_PASSWORD="$(cat "$POSTGRES_PASSWORD_FILE")"
    export POSTGRES_PASSWORD
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "postgres-entrypoint: POSTGRES_PASSWORD is empty; set BAE_POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE)" >&2
        exit 1
    fi
    # Local connections (this container's socket) as the OS user; over the network a password.
    initdb --username=postgres --auth-local=peer --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    pg_ctl --wait --silent --options="-c listen_addresses=''" start
    psql --quiet --no-psqlrc --set=ON_ERROR_STOP=1 --dbname=postgres <<'SQL'
\getenv password POSTGRES_PASSWORD
CREATE ROLE bae LOGIN PASSWORD :'password';
CREATE DATABASE bae OWNER bae;
SQL
    pg_ctl --wait --silent --mode=fast stop
    echo "postgres-entrypoint: made the cluster (database bae, role bae)" >&2
fi
exec postgres -c listen_addresses='*'
