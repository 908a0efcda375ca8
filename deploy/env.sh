# Sourced by the deploy scripts: the settings of deploy/.env, each unless the environment already
# has it (as docker compose does), exported.
while IFS='=' read -r name value || [[ -n "$name" ]]; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    [[ -n "${!name+set}" ]] || export "$name=$value"
done < "$(dirname "${BASH_SOURCE[0]}")/.env"
