#!/usr/bin/env bash
# Stock Kafka (scripts/kafka-peer.sh) with TLS listeners, to compare fjord's
# SSL, mTLS and SASL_SSL with Kafka's: makes a throw-away PKI with the
# openssl CLI, then starts the peer with
#
#   PLAINTEXT  127.0.0.1:PORT      (ANONYMOUS, a super user: creates users, ACLs)
#   CONTROLLER 127.0.0.1:PORT+1
#   SSL        127.0.0.1:PORT+2    TLS, no client certificate (ssl.client.auth=none)
#   MTLS       127.0.0.1:PORT+3    TLS, protocol SSL, ssl.client.auth=required
#   SASL_SSL   127.0.0.1:PORT+4    PLAIN (user alice / alice-secret, from JAAS),
#                                  SCRAM-SHA-256 and SCRAM-SHA-512 (users created
#                                  with AlterUserScramCredentials)
#
# with StandardAuthorizer, allow.everyone.if.no.acl.found=true,
# super.users=User:ANONYMOUS and connections.max.reauth.ms=3000. The server
# keystore and every truststore are PEM (ssl.keystore.type=PEM,
# ssl.truststore.type=PEM); keys are unencrypted PKCS#8 (ECDSA P-256).
#
# usage: scripts/kafka-peer-ssl.sh start [--port P] [--data-dir DIR]   (default 19392, target/kafka-peer/ssl)
#        scripts/kafka-peer-ssl.sh stop  [--data-dir DIR]
#
# Files, in DIR-pki/: ca.pem (what clients trust), server.pem + server.key
# (SAN IP:127.0.0.1, DNS:localhost), server-keystore.pem (key and chain in
# one file, Kafka's ssl.keystore.location), client.pem + client.key (subject
# CLIENT_SUBJECT below, in openssl's order, most significant RDN first). The
# interop_java scenarios run against it with, e.g.:
#
#   FJORD_TEST_BROKER=kafka:127.0.0.1:19392 FJORD_TEST_TLS_PEER=target/kafka-peer/ssl-pki \
#     cargo test --test interop_java tls_
set -euo pipefail
cd "$(dirname "$0")/.."
# A subject with several RDNs and a comma that RFC 2253 escapes.
CLIENT_SUBJECT='/C=NO/O=fjord, test/OU=interop/CN=alice'
cmd=${1:?usage: kafka-peer-ssl.sh start|stop [--port P] [--data-dir DIR]}
shift
port=19392
data=target/kafka-peer/ssl
while [ $# -gt 0 ]; do
    case $1 in
    --port) port=$2; shift 2 ;;
    --data-dir) data=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
if [ "$cmd" = stop ]; then
    exec scripts/kafka-peer.sh stop --data-dir "$data"
fi
[ "$cmd" = start ] || { echo "usage: kafka-peer-ssl.sh start|stop" >&2; exit 2; }

pki=$data-pki
rm -rf "$pki"
mkdir -p "$pki"
ec() { echo "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"; }
# shellcheck disable=SC2046
openssl req -x509 $(ec) -days 2 -subj /CN=fjord-test-ca \
    -keyout "$pki/ca.key" -out "$pki/ca.pem" 2>/dev/null
sign() { # sign NAME SUBJECT EXTENSIONS
    # shellcheck disable=SC2046
    openssl req $(ec) -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
    printf '%b' "$3" > "$pki/$1.ext"
    openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.pem" -CAkey "$pki/ca.key" \
        -CAcreateserial -days 2 -extfile "$pki/$1.ext" -out "$pki/$1.pem" 2>/dev/null
}
sign server /CN=localhost 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n'
sign client "$CLIENT_SUBJECT" 'extendedKeyUsage=clientAuth\n'
cat "$pki/server.key" "$pki/server.pem" > "$pki/server-keystore.pem"
echo "kafka-peer-ssl: PKI in $pki; client subject: $(openssl x509 -in "$pki/client.pem" -noout -subject -nameopt RFC2253)"

p=$port
jaas_plain='org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";'
jaas_scram='org.apache.kafka.common.security.scram.ScramLoginModule required;'
exec scripts/kafka-peer.sh start --fresh --port "$p" --data-dir "$data" \
    --conf "listeners=PLAINTEXT://127.0.0.1:$p,CONTROLLER://127.0.0.1:$((p + 1)),SSL://127.0.0.1:$((p + 2)),MTLS://127.0.0.1:$((p + 3)),SASL_SSL://127.0.0.1:$((p + 4))" \
    --conf "advertised.listeners=PLAINTEXT://127.0.0.1:$p,SSL://127.0.0.1:$((p + 2)),MTLS://127.0.0.1:$((p + 3)),SASL_SSL://127.0.0.1:$((p + 4))" \
    --conf "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,MTLS:SSL,SASL_SSL:SASL_SSL" \
    --conf "ssl.keystore.type=PEM" \
    --conf "ssl.keystore.location=$PWD/$pki/server-keystore.pem" \
    --conf "ssl.truststore.type=PEM" \
    --conf "ssl.truststore.location=$PWD/$pki/ca.pem" \
    --conf "ssl.client.auth=none" \
    --conf "listener.name.mtls.ssl.client.auth=required" \
    --conf "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512" \
    --conf "listener.name.sasl_ssl.plain.sasl.jaas.config=$jaas_plain" \
    --conf "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=$jaas_scram" \
    --conf "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=$jaas_scram" \
    --conf "connections.max.reauth.ms=3000" \
    --conf "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer" \
    --conf "allow.everyone.if.no.acl.found=true" \
    --conf "super.users=User:ANONYMOUS"
