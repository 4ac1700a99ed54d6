#!/usr/bin/env bash
# Integration: TLS and mutual TLS with the real daemon and CLI. Makes a CA,
# a server certificate (SAN IP:127.0.0.1, DNS:localhost) and a client
# certificate signed by it with the openssl CLI, plus a second, unrelated CA
# and a client certificate of that one, then checks:
#   TLS:   the CLI with --tls_ca works; without the CA (system roots) and in
#          plaintext it fails (UNAVAILABLE); a wrong --tls_server_name fails.
#   mTLS:  with a client certificate of the CA it works; without one, or
#          with one of the other CA, it fails.
source "$(dirname "$0")/lib.sh"

command -v openssl >/dev/null || fail "openssl is required (apt-get install openssl)"
pki="$WORK/pki"
mkdir -p "$pki"

# make_ca NAME: a self-signed CA certificate NAME.pem with key NAME.key.
make_ca() {
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$1" \
    -keyout "$pki/$1.key" -out "$pki/$1.pem" 2>/dev/null || fail "openssl: CA $1"
}
# make_cert NAME CA EXTENSIONS: NAME.pem/NAME.key signed by CA.
make_cert() {
  local name=$1 ca=$2 ext=$3
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$name" \
    -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null || fail "openssl: CSR $name"
  printf '%s\n' "$ext" >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/$ca.pem" -CAkey "$pki/$ca.key" \
    -CAcreateserial -days 2 -extfile "$pki/$name.ext" -out "$pki/$name.pem" 2>/dev/null \
    || fail "openssl: sign $name"
}

make_ca ca
make_ca other-ca
make_cert server ca "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
make_cert client ca "extendedKeyUsage=clientAuth"
make_cert stranger other-ca "extendedKeyUsage=clientAuth"
openssl verify -CAfile "$pki/ca.pem" "$pki/server.pem" "$pki/client.pem" >/dev/null \
  || fail "certificates do not verify"

# expect_unavailable ARGS...: the CLI must fail to reach the daemon.
expect_unavailable() {
  local err rc=0
  err=$(cli --timeout 10 "$@" status 2>&1 >/dev/null) || rc=$?
  [[ $rc == 1 ]] || fail "expected exit 1 from '$*', got $rc: $err"
  [[ "$err" == *UNAVAILABLE* ]] || fail "expected UNAVAILABLE from '$*', got: $err"
}

log "TLS: --tls_cert/--tls_key"
start_daemon "$WORK/state" --tls_cert="$pki/server.pem" --tls_key="$pki/server.key"
version=$(cli --tls_ca "$pki/ca.pem" --json status | jq -r .version)
[[ -n "$version" && "$version" != null ]] || fail "status over TLS"
job=$(cli --tls_ca "$pki/ca.pem" --json submit "$(write_job tls 6)" | jq -r .id)
[[ "$job" == job-* ]] || fail "submit over TLS"
cli --tls_ca "$pki/ca.pem" watch "$job" >/dev/null || fail "watch over TLS"
# The name checked in the certificate: localhost is in its SANs.
cli --tls_ca "$pki/ca.pem" --tls_server_name localhost status >/dev/null \
  || fail "--tls_server_name localhost"
expect_unavailable --tls_ca "$pki/ca.pem" --tls_server_name wrong.example
expect_unavailable --tls                       # system roots do not know our CA
expect_unavailable --tls_ca "$pki/other-ca.pem"  # another CA
expect_unavailable                             # plaintext to a TLS port
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"

log "mutual TLS: --tls_client_ca"
start_daemon "$WORK/state" --tls_cert="$pki/server.pem" --tls_key="$pki/server.key" \
  --tls_client_ca="$pki/ca.pem"
cli --tls_ca "$pki/ca.pem" --tls_cert "$pki/client.pem" --tls_key "$pki/client.key" status \
  >/dev/null || fail "mTLS with the CA's client certificate"
[[ $(cli --tls_ca "$pki/ca.pem" --tls_cert "$pki/client.pem" --tls_key "$pki/client.key" \
     --json get "$job" | jq -r .state) == SUCCEEDED ]] || fail "get over mTLS"
expect_unavailable --tls_ca "$pki/ca.pem"
expect_unavailable --tls_ca "$pki/ca.pem" --tls_cert "$pki/stranger.pem" --tls_key "$pki/stranger.key"
# A certificate without its key is a usage error of the CLI.
rc=0
cli --tls_ca "$pki/ca.pem" --tls_cert "$pki/client.pem" status >/dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "--tls_cert without --tls_key: expected exit 2, got $rc"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
