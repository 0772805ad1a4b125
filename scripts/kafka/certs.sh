#!/usr/bin/env bash
# The TLS material of the secured test cluster, made at test time (nothing
# secret is committed): a CA, a keystore per broker node, client
# certificates for mTLS, and one truststore. scripts/lib.sh
# (start_kafka_cluster) runs it, and testkit/src/certs.rs runs the same text.
#
#   certs.sh DIR PASSWORD SPEC...
#     broker=NAME=SANS  NAME.p12: a key and a certificate with CN=broker
#                       (every node is the one principal User:broker) and
#                       the subjectAltNames SANS ("IP:10.77.1.2,IP:10.77.100.1"),
#                       for serverAuth and clientAuth (inter-broker mTLS)
#     client=CN         CN.pem and CN.key (PEM, the key unencrypted, mode
#                       0600): a client certificate with CN=CN, which
#                       ssl.principal.mapping.rules makes User:CN
#   Always: ca.pem (the CA's certificate, what clients trust), ca.key, and
#   truststore.p12 (the CA, for the brokers' JVMs). PASSWORD protects the
#   PKCS12 files.
# EC P-256 keys: generated in milliseconds where RSA takes a noticeable
# part of a second each on 2 busy cores.
set -euo pipefail
dir="$1" pass="$2"
shift 2
umask 077
mkdir -p "$dir"
cd "$dir"
days=7
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
# sign NAME CN EXTENSIONS: NAME.csr from NAME.key, signed by the CA into NAME.pem.
sign() {
    openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
    printf '%b' "$3" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
        -days "$days" -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}
key ca.key
openssl req -x509 -new -key ca.key -subj "/CN=graphsink test CA" -days "$days" -out ca.pem \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
for spec in "$@"; do
    case "$spec" in
        broker=*=*)
            rest="${spec#broker=}" name="${rest%%=*}" sans="${rest#*=}"
            key "$name.key"
            sign "$name" broker "subjectAltName=$sans\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature,keyAgreement"
            openssl pkcs12 -export -in "$name.pem" -inkey "$name.key" -certfile ca.pem \
                -name broker -out "$name.p12" -passout "pass:$pass"
            ;;
        client=*)
            cn="${spec#client=}"
            key "$cn.key"
            sign "$cn" "$cn" "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyAgreement"
            ;;
        *) echo "certs.sh: unknown spec $spec" >&2; exit 2 ;;
    esac
done
# keytool: a PKCS12 truststore whose entry Java takes as a trusted
# certificate (openssl's own export would need -jdktrust).
rm -f truststore.p12
keytool -importcert -noprompt -alias ca -file ca.pem -keystore truststore.p12 \
    -storetype PKCS12 -storepass "$pass" >/dev/null 2>&1
chmod 644 ca.pem
