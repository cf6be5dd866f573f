#!/usr/bin/env bash
# Test certificates for the TLS tests, made fresh in DIR (one day of validity, P-256):
#   ca.crt/.key          the test CA
#   server.crt/.key      signed by it, for 127.0.0.1, 198.18.0.2 (the guest's rxe1) and localhost
#   client.crt/.key      signed by it (mutual TLS)
#   rogue-ca.crt         another CA, and rogue.crt/.key, a server certificate it signed
#   elsewhere.crt/.key   signed by the test CA for another host and address only
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }
ca() {
  key "$1"
  openssl req -x509 -new -key "$1.key" -out "$1.crt" -days 1 -subj "/CN=$1" 2>/dev/null
}
cert() {  # name ca san
  key "$1"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1" 2>/dev/null
  printf 'subjectAltName=%s\n' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -out "$1.crt" \
    -days 1 -extfile "$1.ext" 2>/dev/null
}
ca ca
ca rogue-ca
cert server ca "IP:127.0.0.1,IP:198.18.0.2,DNS:localhost"
cert client ca "DNS:ferry-client"
cert rogue rogue-ca "IP:127.0.0.1,IP:198.18.0.2,DNS:localhost"
cert elsewhere ca "IP:192.0.2.1,DNS:elsewhere.example"
