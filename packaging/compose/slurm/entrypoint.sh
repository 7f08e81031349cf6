#!/bin/bash
# Role entrypoint for the compose Slurm image: controller | compute | restd.
# Keys live in the shared volume /var/lib/slurm-keys: the controller creates the munge key
# and the JWT key on first start; the other roles wait for them. A copy of the JWT key
# readable by gid 10001 (sunkd's group in its image) lets sunkd mint tokens: dev only.
set -euo pipefail
role=${1:-controller}
keys=/var/lib/slurm-keys

if [ "$role" = controller ] && [ ! -s "$keys/munge.key" ]; then
  mungekey -c -k "$keys/munge.key.new"
  mv "$keys/munge.key.new" "$keys/munge.key"
fi
if [ "$role" = controller ] && [ ! -s "$keys/jwt_hs256.key" ]; then
  install -d -m 0750 -g 10001 "$keys/sunkd"
  dd if=/dev/urandom of="$keys/jwt_hs256.key.new" bs=32 count=1 status=none
  install -m 0440 -g 10001 "$keys/jwt_hs256.key.new" "$keys/sunkd/jwt_key"
  chown slurm:slurm "$keys/jwt_hs256.key.new"
  chmod 0600 "$keys/jwt_hs256.key.new"
  mv "$keys/jwt_hs256.key.new" "$keys/jwt_hs256.key"
fi
for _ in $(seq 1 120); do
  [ -s "$keys/munge.key" ] && [ -s "$keys/jwt_hs256.key" ] && break
  sleep 1
done
[ -s "$keys/munge.key" ] || { echo "slurm-entrypoint: no munge key in $keys" >&2; exit 1; }

install -m 0400 -o munge -g munge "$keys/munge.key" /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
runuser -u munge -- munged
for _ in $(seq 1 50); do munge -n >/dev/null 2>&1 && break; sleep 0.2; done

case "$role" in
  controller) exec slurmctld -D -i ;;
  compute)    exec slurmd -D -N "$(hostname -s)" ;;
  restd)      export SLURM_JWT=daemon
              exec slurmrestd -u nobody -a rest_auth/jwt \
                -s openapi/v0.0.36,openapi/v0.0.37,openapi/v0.0.38 0.0.0.0:6820 ;;
  *)          exec "$@" ;;
esac
