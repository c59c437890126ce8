#!/usr/bin/env bash
# Prints the failed cases of the newest Common Test run under LOGDIR (default
# _build/test/logs): each case's reason, then the end of its log (what it
# printed), so that the tail of a CI log names what failed and why. CI keeps
# only the end of the output, and rebar3 ct's summary names no case.
# Usage: test/ct_failures.sh [LOGDIR]
logdir=${1:-_build/test/logs}
run=$(ls -dt "$logdir"/ct_run.* 2>/dev/null | head -1)
[ -n "$run" ] || { echo "ct_failures: no Common Test run under $logdir"; exit 0; }
find -L "$run" -name suite.log | while read -r log; do
    dir=$(dirname "$log")
    # "CASE LOGFILE" of each failed case, then its reason's first lines.
    awk '
        /^=case/    { c = $2 }
        /^=logfile/ { f = $2 }
        /^=result *failed/ { print "ct_failures: " c " FAILED (" f ")"; n = 0; show = 1 }
        show && n < 15 { print "    " $0; n++ }
        /^=== \*\*\* FAILED/ { show = 0 }
    ' "$log"
    # The end of each failed case's log, tags stripped.
    awk '/^=logfile/ { f = $2 } /^=result *failed/ { print f }' "$log" | while read -r f; do
        echo "ct_failures: the end of $f:"
        sed -e 's/<[^>]*>//g' -e 's/&lt;/</g; s/&gt;/>/g; s/&quot;/"/g; s/&amp;/\&/g' "$dir/$f" \
            | grep -v -e '^\s*$' -e '^Test run history' -e 'Top level test index' \
                      -e 'Latest test result' -e '^Copyright' -e '^Updated:' \
            | tail -25 | sed 's/^/    /'
    done
done
