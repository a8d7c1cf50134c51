#!/bin/sh
# Runs a plan of commands one after another on one machine, so that the builds they compare are
# timed under the same conditions (alternate them: a, b, a, b), and keeps each one's whole output.
#
#   bench/alternate.sh OUTDIR PLAN
#
# PLAN has one run a line, "label command [arguments]", e.g.
#   main-1  ./gdn-main bench --bf16
#   cand-1  ./gdn-cand bench --bf16
#   tests   ./gdn_device_tests --gtest_brief=1
# ('#' lines and blank lines are skipped; labels are file names, each used once). The whole plan is checked before
# anything runs. Each run's output goes to OUTDIR/label.txt; after each, one line says its label,
# exit status and the figures worth a glance: the bench's "forward + backward" and "tape" lines, a
# test binary's PASSED / FAILED count. Exits 1 if any run failed, 2 on a bad plan.
set -u
if [ $# -ne 2 ]; then
  echo "usage: $0 OUTDIR PLAN" >&2
  exit 2
fi
out=$1
plan=$2
[ -r "$plan" ] || { echo "$0: cannot read the plan '$plan'" >&2; exit 2; }
# The plan's runs as "label command" lines, or a refusal naming the bad line.
lines() {
  seen=' '
  while read -r label cmd || [ -n "$label" ]; do  # (a last line without a newline too)
    case "$label" in '' | '#'*) continue ;; esac
    case "$label" in *[!A-Za-z0-9._-]*)
      echo "$0: the label '$label' is not a file name (letters, digits, '.', '_', '-')" >&2
      return 2 ;;
    esac
    case "$seen" in *" $label "*)
      echo "$0: the label '$label' is used twice (its second run would overwrite the first's output)" >&2
      return 2 ;;
    esac
    seen="$seen$label "
    if [ -z "$cmd" ]; then
      echo "$0: the plan's line '$label' has no command" >&2
      return 2
    fi
    printf '%s %s\n' "$label" "$cmd"
  done < "$plan"
}
checked=$(lines) || exit 2
[ -n "$checked" ] || { echo "$0: the plan '$plan' has no runs" >&2; exit 2; }
mkdir -p "$out" || exit 2
status=0
while read -r label cmd; do
  sh -c "$cmd" < /dev/null > "$out/$label.txt" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  glance=$(grep -E '^forward \+ backward:|^tape:|^\[  (PASSED|FAILED)  \]' "$out/$label.txt" | sed 's/ on the device.*//' | tr '\n' ' ')
  echo "$label rc=$rc $glance"
done <<EOF_PLAN
$checked
EOF_PLAN
exit $status
