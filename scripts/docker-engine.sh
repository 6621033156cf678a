#!/usr/bin/env bash
# A Docker engine for the docker tests: `docker info` must answer.
#
#   scripts/docker-engine.sh          start one if none answers; prints "started PID" or "running"
#   scripts/docker-engine.sh stop     stop the dockerd that this script started (its pidfile), if any
#
# Debian's docker.io is installed if dockerd is missing, and docker-compose (Compose v1: Debian has no v2 plugin)
# if no Compose is there. When no engine answers, dockerd is started as root in the background. Only the last
# line goes to stdout, so a caller knows whether to stop the engine afterwards: a dockerd someone else runs is
# never stopped. Progress and errors go to stderr.
set -euo pipefail

PIDFILE=${TYPEWRITER_DOCKERD_PIDFILE:-/run/typewriter-dockerd.pid}
LOG=${TYPEWRITER_DOCKERD_LOG:-/var/log/typewriter-dockerd.log}
WAIT_S=${TYPEWRITER_DOCKERD_WAIT_S:-60}

say() { echo "docker-engine: $*" >&2; }

engine_answers() { docker info >/dev/null 2>&1; }

install_engine() {
    local missing=()
    command -v dockerd >/dev/null && command -v docker >/dev/null || missing+=(docker.io)
    docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || missing+=(docker-compose)
    ((${#missing[@]})) || return 0
    say "installing Debian's ${missing[*]} (log: $LOG)"
    export DEBIAN_FRONTEND=noninteractive
    # Another apt-get may hold the lock (other test groups install their packages too): wait for it.
    apt-get -o DPkg::Lock::Timeout=600 update -qq >>"$LOG" 2>&1
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1 || {
        say "apt-get failed; the end of $LOG:"
        tail -n 20 "$LOG" >&2
        exit 1
    }
}

start_engine() {
    say "starting dockerd (log: $LOG)"
    # setsid: the engine outlives this script and a Ctrl-C in the caller's terminal.
    setsid dockerd --pidfile "$PIDFILE" >>"$LOG" 2>&1 </dev/null &
    local deadline=$((SECONDS + WAIT_S))
    until engine_answers; do
        if ! kill -0 $! 2>/dev/null; then
            say "dockerd exited; the end of $LOG:"
            tail -n 20 "$LOG" >&2
            exit 1
        fi
        if ((SECONDS > deadline)); then
            say "dockerd did not answer within ${WAIT_S}s; see $LOG"
            exit 1
        fi
        sleep 0.5
    done
    echo "started $(cat "$PIDFILE")"
}

stop_engine() {
    [[ -f $PIDFILE ]] || { say "no dockerd started by this script"; return; }
    local pid
    pid=$(cat "$PIDFILE")
    if kill -0 "$pid" 2>/dev/null; then
        say "stopping dockerd $pid"
        kill -TERM "$pid"
        # dockerd stops its containers first (their own stop timeouts), then removes the pidfile.
        for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        if kill -0 "$pid" 2>/dev/null; then
            say "dockerd $pid still runs after 60 s"
            exit 1
        fi
    fi
    rm -f "$PIDFILE"
    echo "stopped $pid"
}

case ${1:-start} in
    start) install_engine; if engine_answers; then echo running; else start_engine; fi ;;
    stop) stop_engine ;;
    *) say "usage: $0 [start|stop]"; exit 2 ;;
esac
