# shellcheck shell=bash
# Shared by scripts/kafka-peer.sh and scripts/kafka-cli (source it, do not run
# it): resolves stock Apache Kafka's jars with Maven through
# interop/kafka-peer/pom.xml and hands out the classpath.
#
# The jars are cached in target/kafka-peer/lib with the classpath in
# target/kafka-peer/classpath.txt. Maven runs only when that cache is missing
# or the pom changed since the last successful resolve (a sha256 stamp of the
# pom records that). It runs offline first, so a CI job that resolved once
# never touches the network again, and falls back to an online resolve when
# the local repository lacks something. A lock serialises concurrent callers
# (several kafka-cli invocations started at once would otherwise all run
# Maven into the same directory).
#
# Environment: MVN (default mvn), JAVA (default $JAVA_HOME/bin/java or java),
# KAFKA_PEER_HOME (default <repo>/target/kafka-peer).

KAFKA_REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KAFKA_PEER_POM=$KAFKA_REPO_ROOT/interop/kafka-peer/pom.xml
KAFKA_PEER_HOME=${KAFKA_PEER_HOME:-$KAFKA_REPO_ROOT/target/kafka-peer}
KAFKA_CLASSPATH_FILE=$KAFKA_PEER_HOME/classpath.txt
# The two log4j2 configurations are used by the scripts that source this.
# shellcheck disable=SC2034
KAFKA_LOG4J_TOOLS=$KAFKA_REPO_ROOT/interop/kafka-peer/log4j2-tools.properties
# shellcheck disable=SC2034
KAFKA_LOG4J_BROKER=$KAFKA_REPO_ROOT/interop/kafka-peer/log4j2-broker.properties
# A first online resolve takes about 15 s here; a stalled repository must
# still not hang a CI job forever.
KAFKA_RESOLVE_LOCK_WAIT_S=600

if [ -n "${JAVA:-}" ]; then
  :
elif [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
  JAVA=$JAVA_HOME/bin/java
else
  JAVA=java
fi

kafka_pom_stamp() {
  sha256sum "$KAFKA_PEER_POM" | cut -d' ' -f1
}

# True when classpath.txt was written from the current pom and every jar it
# names still exists.
kafka_cache_fresh() {
  [ -s "$KAFKA_CLASSPATH_FILE" ] && [ -f "$KAFKA_PEER_HOME/pom.sha256" ] || return 1
  [ "$(cat "$KAFKA_PEER_HOME/pom.sha256")" = "$(kafka_pom_stamp)" ] || return 1
  local jar
  local -a jars
  IFS=: read -r -a jars <"$KAFKA_CLASSPATH_FILE"
  for jar in "${jars[@]}"; do
    [ -f "$jar" ] || return 1
  done
}

# Runs Maven unless the cache is fresh. Maven's output goes to stderr so that
# a tool's stdout stays clean for pipes.
kafka_resolve() {
  kafka_cache_fresh && return 0
  mkdir -p "$KAFKA_PEER_HOME"
  (
    flock -w "$KAFKA_RESOLVE_LOCK_WAIT_S" 9 || {
      echo "kafka-classpath: timed out after ${KAFKA_RESOLVE_LOCK_WAIT_S}s waiting for $KAFKA_PEER_HOME/resolve.lock" >&2
      exit 1
    }
    # Another caller may have resolved while this one waited for the lock.
    kafka_cache_fresh && exit 0
    local mvn=${MVN:-mvn} started=$SECONDS
    command -v "$mvn" >/dev/null || { echo "kafka-classpath: Maven ($mvn) not found" >&2; exit 1; }
    # Jars of an older Kafka version must not linger next to the new ones.
    rm -rf "${KAFKA_PEER_HOME:?}/lib" "$KAFKA_CLASSPATH_FILE" "$KAFKA_PEER_HOME/pom.sha256"
    local -a args=(-q -B -f "$KAFKA_PEER_POM" "-Dkafka.peer.home=$KAFKA_PEER_HOME" package)
    echo "kafka-classpath: resolving Kafka jars with Maven ($KAFKA_PEER_POM)" >&2
    if ! "$mvn" -o "${args[@]}" >"$KAFKA_PEER_HOME/mvn-offline.log" 2>&1; then
      echo "kafka-classpath: offline resolve failed, resolving online" >&2
      "$mvn" "${args[@]}" >"$KAFKA_PEER_HOME/mvn-online.log" 2>&1 || {
        cat "$KAFKA_PEER_HOME/mvn-online.log" >&2
        echo "kafka-classpath: Maven resolve failed (log above, in $KAFKA_PEER_HOME/mvn-online.log)" >&2
        exit 1
      }
    fi
    [ -s "$KAFKA_CLASSPATH_FILE" ] || { echo "kafka-classpath: Maven wrote no $KAFKA_CLASSPATH_FILE" >&2; exit 1; }
    kafka_pom_stamp >"$KAFKA_PEER_HOME/pom.sha256"
    echo "kafka-classpath: resolved in $((SECONDS - started)) s into $KAFKA_PEER_HOME/lib" >&2
  ) 9>"$KAFKA_PEER_HOME/resolve.lock"
}

# Prints the classpath (resolving first if needed).
kafka_classpath() {
  kafka_resolve
  cat "$KAFKA_CLASSPATH_FILE"
}

# Prints the exact Kafka version and commit as built into kafka-clients
# (the same properties file AppInfoParser reads at start-up), e.g.
# "4.4.0 (commit 1156b2752aaa28ea)".
kafka_version() {
  kafka_resolve
  local entry jar='' props version commit
  local -a jars
  # classpath.txt has no final newline, so read reports end of file (1).
  IFS=: read -r -a jars <"$KAFKA_CLASSPATH_FILE" || true
  for entry in "${jars[@]}"; do
    [[ $entry == */kafka-clients-*.jar ]] && { jar=$entry; break; }
  done
  [ -n "$jar" ] || { echo "kafka-classpath: no kafka-clients jar on the classpath" >&2; return 1; }
  props=$(unzip -p "$jar" kafka/kafka-version.properties)
  version=$(sed -n 's/^version=//p' <<<"$props")
  commit=$(sed -n 's/^commitId=//p' <<<"$props")
  echo "$version (commit $commit)"
}
