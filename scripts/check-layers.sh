#!/usr/bin/env bash
# The server crate's imports point one way:
#
#   cli -> server -> engine -> node -> store -> algorithm
#                           \-> rules --------------------^
#                              node -> cluster (etcd control plane) -> store
#                              node -> config (plain settings; the node builds
#                                      the store's and the control plane's
#                                      from them)
#   server: the ports, which reach the store and the algorithms only through
#    the engine.
#   cli: the commands; it may reach any module, and no module reaches it.
#   admin_client: the admin API's HTTP client, for cli (and the tests);
#    over tls only, and no module but cli reaches it.
#   (clock, slot, sync, units, throttled, tls, huge_pages, log_text: leaves
#    that import no layer;
#    events: a leaf the engine feeds, which config describes)
#
# Each row below names a layer (a folder or file under src/) and the crate
# modules it must never reach. A file breaks the rule when it names one of
# them through `crate::` (a path, or a `use crate::{..}` group, on one line
# or several) or through enough `super::` to climb to the crate root.
# A row whose list is "-" forbids nothing (it says so on purpose, and
# checks that the layer still exists). Comments are ignored. Exit 1 and
# one line per offence when the direction is broken; run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

LEAVES="algorithm store node engine server cli config rules throttled admin_client cluster events log_text"
RULES=(
  "src/algorithm   store node engine server cli config rules throttled admin_client"
  "src/store       node engine server cli config rules throttled admin_client"
  "src/config      store cluster node engine server cli rules admin_client"
  "src/node        engine server cli rules admin_client"
  "src/cluster     node engine server cli config rules throttled admin_client"
  "src/rules       store node engine server cli config throttled admin_client"
  "src/engine      server cli admin_client"
  "src/server      store algorithm cli admin_client"
  "src/cli         -"
  "src/admin_client.rs $LEAVES"
  "src/log_text.rs $LEAVES"
  "src/clock.rs    $LEAVES"
  "src/slot.rs     $LEAVES"
  "src/sync.rs     $LEAVES"
  "src/units.rs    $LEAVES"
  "src/huge_pages.rs $LEAVES"
  "src/prefetch.rs $LEAVES"
  "src/throttled.rs $LEAVES"
  "src/tls         $LEAVES"
  "src/events      $LEAVES"
)

status=0
for rule in "${RULES[@]}"; do
  read -r layer forbidden <<<"$rule"
  [[ -e $layer ]] || { echo "check-layers: $layer does not exist (update scripts/check-layers.sh)"; status=1; continue; }
  [[ $forbidden == "-" ]] && continue
  while IFS= read -r file; do
    # Depth of the file's module below the crate root: src/node/x.rs is
    # node::x (2), src/node/mod.rs is node (1).
    rel=${file#src/}
    depth=$(awk -F/ '{ n = NF; if ($NF == "mod.rs") n--; print n }' <<<"$rel")
    FORBIDDEN="$forbidden" DEPTH="$depth" FILE="$file" perl -0777 -ne '
      my @mods = split " ", $ENV{FORBIDDEN};
      my $alt = join "|", @mods;
      s{/\*.*?\*/}{}gs;          # block comments
      s{//[^\n]*}{}g;            # line and doc comments
      my $up = "(?:super::){$ENV{DEPTH}}";
      my @found;
      while (/\b(?:crate::|$up)($alt)\b/g) { push @found, $1 }
      while (/\b(?:crate::|$up)\{([^;]*)/g) {
        my $group = $1;
        while ($group =~ /(?:^|[{,])\s*($alt)\b/g) { push @found, $1 }
      }
      push @found, "*" if /\bcrate::\*/;
      my %seen;
      for my $m (grep { !$seen{$_}++ } @found) {
        print "$ENV{FILE}: imports crate::$m, which its layer must not reach\n";
      }
      exit(@found ? 1 : 0);
    ' "$file" || status=1
  done < <(find "$layer" -name '*.rs' | sort)
done

if [[ $status -ne 0 ]]; then
  echo "check-layers: an import points the wrong way (see the table in scripts/check-layers.sh)"
  exit 1
fi
echo "check-layers: every import points one way"
