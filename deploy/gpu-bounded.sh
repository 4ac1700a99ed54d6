#!/usr/bin/env bash
# Sourced by the device scripts: wait_bounded PID LIMIT LABEL waits at most
# LIMIT seconds for the background process PID; one still running then is a
# hang: every thread's stack from gdb (where installed) is printed under
# LABEL and the process is killed. Returns the process's exit status.
wait_bounded() {
  local pid=$1 limit=$2 label=$3
  for _ in $(seq "$limit"); do kill -0 "$pid" 2> /dev/null || break; sleep 1; done
  if kill -0 "$pid" 2> /dev/null; then
    echo "$label: still running after $limit s; gdb: $(command -v gdb || echo none)"
    command -v gdb > /dev/null &&
      timeout 90 gdb -p "$pid" -batch -ex 'thread apply all bt 16' 2>&1 |
      grep -E '^Thread|^#' | grep -vE 'libc\.so|pthread_cond|futex|__GI_|syscall|clock_nanosleep' |
      head -90
    kill -9 "$pid"
  fi
  wait "$pid"
}
