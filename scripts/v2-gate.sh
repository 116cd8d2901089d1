# v2-gate.sh — sourced by scripts/v2-stage.sh: `gate DIR PID [DIR PID...]` runs until every guest's PID is gone.
# Needs: out (the stage's results dir), log (a function), V2_WAIT_FOR_HOST (1: wait for $out/host-done).
#
# The gate: one side at a time runs what is marked alone (scripts/v2-stage.sh boots one guest at a time and gates each;
# the gate itself takes any number of guests at once). A guest says its next test is marked alone by
# <dir>/alone-ready (tests/support/v2guest.py) and waits for <dir>/host-done, which this loop creates once the host's
# stages are done (V2_WAIT_FOR_HOST: $out/host-done, from scripts/test-all.sh) and the other guest is done or waits
# too; that guest's turn comes when this one is done. So the guests' other tests share the machine with everything,
# and each guest's alone tests, like the host's after the stage, have it to themselves.
guest_done() { [ -e "$1/rc" ] || ! kill -0 "$2" 2>/dev/null; }
gate() {
  local -a dirs=() pids=()
  while [ $# -gt 0 ]; do dirs+=("$1") pids+=("$2"); shift 2; done
  local holder=-1 i j others alive
  while :; do
    alive=0
    for i in "${!pids[@]}"; do ! kill -0 "${pids[$i]}" 2>/dev/null || alive=1; done
    [ "$alive" = 1 ] || return 0
    if [ "$holder" -ge 0 ] && guest_done "${dirs[$holder]}" "${pids[$holder]}"; then holder=-1; fi
    if [ "$holder" -lt 0 ] && { [ "${V2_WAIT_FOR_HOST:-}" != 1 ] || [ -e "$out/host-done" ]; }; then
      for i in "${!dirs[@]}"; do
        [ -e "${dirs[$i]}/alone-ready" ] && [ ! -e "${dirs[$i]}/host-done" ] || continue
        others=1
        for j in "${!dirs[@]}"; do
          [ "$j" != "$i" ] || continue
          guest_done "${dirs[$j]}" "${pids[$j]}" ||
            { [ -e "${dirs[$j]}/alone-ready" ] && [ ! -e "${dirs[$j]}/host-done" ]; } || others=0
        done
        [ "$others" = 1 ] || continue
        log "the turn of the tests marked alone: ${dirs[$i]##*/} guest"
        : > "${dirs[$i]}/host-done"
        holder=$i
        break
      done
    fi
    sleep 1 &
    wait $! 2>/dev/null || true
  done
}
