# shellcheck shell=bash
# Sourced by the recipe launchers: recipes_unknown_option WHO OPTION KNOWN... prints the one line an option the
# launcher does not take is refused with (exit 2 is the caller's), with the nearest known option when one is close
# (`--dryrun`: did you mean --dry-run?). A Hydra override never starts with `--`, so such an argument is a mistyped
# option, not an override to hand on.
recipes_unknown_option() {
  local who="$1" arg="$2" near
  shift 2
  near="$(awk -v arg="${arg%%=*}" '
    function norm(s) { s = tolower(s); gsub(/_/, "-", s); return s }
    function lev(s, t,    m, n, i, j, d, a, b, x) {
      m = length(s); n = length(t)
      for (i = 0; i <= m; i++) d[i, 0] = i
      for (j = 0; j <= n; j++) d[0, j] = j
      for (i = 1; i <= m; i++) for (j = 1; j <= n; j++) {
        a = d[i - 1, j] + 1; b = d[i, j - 1] + 1; x = d[i - 1, j - 1] + (substr(s, i, 1) != substr(t, j, 1))
        d[i, j] = a < b ? (a < x ? a : x) : (b < x ? b : x)
      }
      return d[m, n]
    }
    BEGIN {
      best = ""; bestd = 99
      for (k = 1; k < ARGC; k++) {
        dist = lev(norm(arg), norm(ARGV[k]))
        if (dist <= (length(ARGV[k]) >= 7 ? 2 : 1) && dist < bestd) { best = ARGV[k]; bestd = dist }
      }
      print best
      exit
    }' "$@")"
  if [ -n "$near" ]; then
    echo "$who: unknown option '$arg'; did you mean $near? (run with --help)" >&2
  else
    echo "$who: unknown option '$arg'; run with --help" >&2
  fi
}
