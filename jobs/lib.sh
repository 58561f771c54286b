# Sourced by the table scripts. `job RAYDG-ARGS...` plans one job; `submit_jobs "$@"` submits
# the planned jobs in order with jobs/submit.sh, each with the table script's own arguments
# (--address, --wait, more raydg options) appended. If a submission fails, it stops there and
# lists the jobs already submitted (and how to stop them) and those not submitted.
# RAYDG_DRY_RUN=1 prints the planned jobs' arguments, one job per line, and submits nothing.
planned=()

job() { planned+=("$(printf '%q ' "$@")"); }

submit_jobs() {
  local submit i j id words ids=()
  submit=$(dirname "${BASH_SOURCE[0]}")/submit.sh
  for i in "${!planned[@]}"; do
    eval "words=(${planned[$i]})"
    if [ -n "${RAYDG_DRY_RUN:-}" ]; then
      printf '%q ' "${words[@]}" "$@"; echo
    elif id=$("$submit" "${words[@]}" "$@"); then
      ids+=("$id")
      echo "submitted $id: ${planned[$i]}"
    else
      echo "${0##*/}: job $((i + 1)) of ${#planned[@]} was not submitted: ${planned[$i]}" >&2
      if [ ${#ids[@]} -gt 0 ]; then
        echo "submitted before it (each stops with: ray job stop ID --address ADDR):" >&2
        for j in "${!ids[@]}"; do echo "  ${ids[$j]}  ${planned[$j]}" >&2; done
      fi
      echo "not submitted:" >&2
      for ((j = i; j < ${#planned[@]}; j++)); do echo "  ${planned[$j]}" >&2; done
      return 1
    fi
  done
}
