#!/bin/bash
# What the official image's entrypoint does for deploy/compose.yaml. Started as root, it gives
# the data directory and the socket directory (a fresh volume and tmpfs, owned by root) to the
# user postgres and runs again as that user. On the first start (an empty PGDATA): a cluster whose
# superuser is POSTGRES_USER with POSTGRES_PASSWORD, the database POSTGRES_DB, then the scripts of
# /docker-entrypoint-initdb.d run in it. Every start: the server, with passwords required over TCP.
set -euo pipefail
shopt -s nullglob

if [[ "$(id -u)" == 0 ]]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

user="${POSTGRES_USER:-postgres}"
database="${POSTGRES_DB:-$user}"
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"

if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
    password="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$password"
    initdb --username="$user" --pwfile="$password" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$password"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    # Set up over the local socket only: nobody connects over TCP before the set-up is done.
    pg_ctl --wait --silent -o "-c listen_addresses=''" start
    psql=(psql -v ON_ERROR_STOP=1 --quiet --username "$user" --no-password)
    if [[ "$database" != postgres ]]; then
        "${psql[@]}" --dbname postgres -c "CREATE DATABASE \"$database\""
    fi
    for script in /docker-entrypoint-initdb.d/*; do
        case "$script" in
            *.sql) echo "running $script"; "${psql[@]}" --dbname "$database" -f "$script" ;;
            *.sh) echo "running $script"; source "$script" ;;
            *) echo "ignoring $script" ;;
        esac
    done
    pg_ctl --wait --silent -m fast stop
    echo "PostgreSQL set up: database $database, owner $user"
fi
exec "$@"
