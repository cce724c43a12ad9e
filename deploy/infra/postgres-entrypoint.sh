#!/bin/sh
# The `postgres` service of docker-compose.replicas.yml. On an empty data volume it makes
# the cluster: a `bae` role with the password in POSTGRES_PASSWORD (from the environment,
# never in the image; it reaches the server through psql's \getenv, so it is on no
# command line and in no log), owning the `bae` database. Then it runs the server.
set -eu

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "postgres-entrypoint: POSTGRES_PASSWORD is empty; set BAE_POSTGRES_PASSWORD" >&2
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
