#!/bin/sh
# meson test 'units' (suite systemd): checks the configured unit files and
# the sysusers.d/tmpfiles.d snippets without a running systemd.
#
# What it proves:
#   1. `systemd-analyze verify` accepts the system units in a scratch root
#      laid out as `meson install` lays them out: every directive and value
#      parses on this systemd, the ExecStart binary path is the one the units
#      are installed with, specifiers resolve, Requires=/Service= name units
#      that exist. verify exits 0 on mere parse warnings ("Unknown key",
#      "Failed to parse ..., ignoring"), so any line it prints is a failure
#      too; a canary (a unit with a misspelt key) shows the check catches one.
#   2. The same for the user units under `systemd-analyze --user` (verify
#      has no --root for the user scope: a scratch copy points ExecStart at
#      a stub executable).
#   3. `systemd-analyze security --offline` rates the services at or below a
#      threshold (system 2.0, user 7.0: a user manager cannot sandbox the
#      file system without user namespaces), so hardening cannot silently
#      go missing. (--threshold counts in tenths: 20 is 2.0.)
#   4. Names agree across files: User=, Group=, SocketUser=, SocketGroup= and
#      the sysusers.d user; the socket's directory and RuntimeDirectory=.
#   5. As root: systemd-sysusers and systemd-tmpfiles applied to a scratch
#      root create the user (home /var/lib/turbokv, no login shell) and the
#      directories with the owners the units expect.
#   6. When this build installs a turbokvd, ExecStart names its install path.
#   7. With --http yes: the turbokv-http units (system and user) pass the
#      same verify (no output) and security thresholds (system 2.0, user
#      7.0), the system service joins the group that owns the daemon's
#      socket, and both listen on loopback only.
# What it does not prove: that the daemon starts, sandboxed, under a real
# systemd (no systemd runs here); see docs/systemd.md for the manual check.
#
# Usage: test-units.sh --units DIR --sbindir DIR --systemdir DIR
#          --sysusers FILE --tmpfiles FILE --build-root DIR
#          [--bindir DIR --http yes|no]
# DIR/turbokvd.{service,socket} and DIR/user/turbokvd.{service,socket} are
# the configured units. $SYSTEMD_ANALYZE overrides the systemd-analyze path.
set -eu

units= sbindir= systemdir= sysusers= tmpfiles= build_root= bindir=/usr/bin http=no
while [ $# -gt 1 ]; do
	case $1 in
	--units) units=$2 ;;
	--sbindir) sbindir=$2 ;;
	--systemdir) systemdir=$2 ;;
	--sysusers) sysusers=$2 ;;
	--tmpfiles) tmpfiles=$2 ;;
	--build-root) build_root=$2 ;;
	--bindir) bindir=$2 ;;
	--http) http=$2 ;;
	*) echo "test-units: unknown argument $1" >&2; exit 2 ;;
	esac
	shift 2
done
[ $# -eq 0 ] && [ -n "$units" ] && [ -n "$sbindir" ] && [ -n "$systemdir" ] &&
	[ -n "$sysusers" ] && [ -n "$tmpfiles" ] && [ -n "$build_root" ] ||
	{ echo "test-units: missing arguments (see the header)" >&2; exit 2; }

# systemd-sysusers and systemd-tmpfiles take a relative file for a name to
# look up in their search path.
sysusers=$(realpath "$sysusers")
tmpfiles=$(realpath "$tmpfiles")

sa=${SYSTEMD_ANALYZE:-systemd-analyze}
command -v "$sa" >/dev/null || { echo "SKIP: no systemd-analyze"; exit 77; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/turbokv-units.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
failed=0

fail() {
	echo "FAIL: $*"
	failed=1
}

# clean NAME CMD...: CMD must exit 0 and print nothing.
clean() {
	name=$1
	shift
	if "$@" >"$tmp/out" 2>&1 && [ ! -s "$tmp/out" ]; then
		echo "ok: $name"
	else
		fail "$name"
		sed 's/^/    /' "$tmp/out"
	fi
}

# quiet_rc NAME CMD...: CMD must exit 0 and print nothing on stderr (its
# stdout is a report, shown only on failure).
quiet_rc() {
	name=$1
	shift
	if "$@" >"$tmp/out" 2>"$tmp/err" && [ ! -s "$tmp/err" ]; then
		echo "ok: $name ($(grep 'Overall exposure' "$tmp/out" | sed 's/.*: //'))"
	else
		fail "$name"
		sed 's/^/    /' "$tmp/err" "$tmp/out"
	fi
}

# The value of KEY= in unit FILE (last one wins, as in systemd).
unit_get() {
	sed -n "s/^$2=//p" "$1" | tail -n 1
}

# --- 1. system units in a scratch root ------------------------------------
root=$tmp/root
mkdir -p "$root$systemdir" "$root$sbindir" "$root/usr/lib/systemd/system"
cp "$units/turbokvd.service" "$units/turbokvd.socket" "$root$systemdir/"
# The targets and slices every unit depends on, from the host (no services).
for d in /usr/lib/systemd/system /lib/systemd/system; do
	[ -d "$d" ] || continue
	for f in "$d"/*.target "$d"/*.slice; do
		[ -e "$f" ] && [ ! -e "$root/usr/lib/systemd/system/${f##*/}" ] &&
			cp -P "$f" "$root/usr/lib/systemd/system/"
	done
done
printf '#!/bin/sh\nexit 0\n' >"$root$sbindir/turbokvd"
chmod 755 "$root$sbindir/turbokvd"

sys_verify() {
	"$sa" verify --man=no --root="$root" "$@"
}
clean "system units: systemd-analyze verify" \
	sys_verify "$systemdir/turbokvd.service" "$systemdir/turbokvd.socket"

# The canary: a misspelt key must make the same check fail.
cp "$units/turbokvd.service" "$root$systemdir/turbokvd-canary.service"
echo "NoNewPrivilege=yes" >>"$root$systemdir/turbokvd-canary.service"
sed -i 's/^\[Install\]$//; s/^Also=.*//' "$root$systemdir/turbokvd-canary.service"
if sys_verify "$systemdir/turbokvd-canary.service" >"$tmp/out" 2>&1 &&
	[ ! -s "$tmp/out" ]; then
	fail "canary: a misspelt key went unnoticed by systemd-analyze verify"
else
	echo "ok: canary (a misspelt key is reported)"
fi
rm -f "$root$systemdir/turbokvd-canary.service"

quiet_rc "system service: systemd-analyze security <= 2.0" \
	"$sa" security --offline=yes --threshold=20 --root="$root" \
	"$systemdir/turbokvd.service"

# A missing ExecStart binary is an error (the path is really checked).
mv "$root$sbindir/turbokvd" "$tmp/turbokvd.stub"
if sys_verify "$systemdir/turbokvd.service" >"$tmp/out" 2>&1; then
	fail "verify passed although $sbindir/turbokvd is missing"
else
	echo "ok: a missing $sbindir/turbokvd is reported"
fi
mv "$tmp/turbokvd.stub" "$root$sbindir/turbokvd"

# --- 2, 3. user units ----------------------------------------------------
user=$tmp/user
mkdir -p "$user/units" "$user/run" "$user/home/.config"
chmod 700 "$user/run"
for u in turbokvd.service turbokvd.socket; do
	sed "s|^ExecStart=$sbindir/turbokvd |ExecStart=$root$sbindir/turbokvd |" \
		"$units/user/$u" >"$user/units/$u"
done
grep -q "^ExecStart=$root$sbindir/turbokvd " "$user/units/turbokvd.service" ||
	fail "user service: ExecStart is not $sbindir/turbokvd"

user_sa() {
	env HOME="$user/home" XDG_CONFIG_HOME="$user/home/.config" \
		XDG_RUNTIME_DIR="$user/run" "$sa" --user "$@"
}
clean "user units: systemd-analyze --user verify" \
	user_sa verify --man=no "$user/units/turbokvd.service" "$user/units/turbokvd.socket"
quiet_rc "user service: systemd-analyze --user security <= 7.0" \
	user_sa security --offline=yes --threshold=70 "$user/units/turbokvd.service"

# --- 4. names agree across files -----------------------------------------
before=$failed
failed=0
svc=$units/turbokvd.service
sock=$units/turbokvd.socket
sysuser=$(awk '$1 == "u" { print $2; exit }' "$sysusers")
for pair in "User:$svc" "Group:$svc" "SocketUser:$sock" "SocketGroup:$sock"; do
	key=${pair%%:*}
	val=$(unit_get "${pair#*:}" "$key")
	[ "$val" = "$sysuser" ] ||
		fail "$key=$val, but sysusers.d creates '$sysuser'"
done
for f in "$sock:/run/" "$units/user/turbokvd.socket:%t/"; do
	file=${f%%:*}
	base=${f#*:}
	svcfile=${file%.socket}.service
	listen=$(unit_get "$file" ListenStream)
	rundir=$(unit_get "$svcfile" RuntimeDirectory)
	[ "${listen%/*}" = "$base$rundir" ] ||
		fail "$file listens on $listen, outside RuntimeDirectory=$rundir"
	[ "$(unit_get "$svcfile" RuntimeDirectoryPreserve)" = yes ] ||
		fail "$svcfile: RuntimeDirectoryPreserve=yes is needed (the socket lives there)"
	[ "$(unit_get "$file" Service)" = turbokvd.service ] ||
		fail "$file: Service= is not turbokvd.service"
done
[ "$failed" -eq 0 ] && echo "ok: names agree across the units and sysusers.d"
[ "$before" -eq 0 ] || failed=1

# --- 5. sysusers.d and tmpfiles.d applied to a scratch root ----------------
if [ "$(id -u)" -ne 0 ]; then
	echo "note: not root, systemd-sysusers/systemd-tmpfiles not applied"
elif ! command -v systemd-sysusers >/dev/null || ! command -v systemd-tmpfiles >/dev/null; then
	echo "note: no systemd-sysusers/systemd-tmpfiles, not applied"
else
	sroot=$tmp/sysroot
	mkdir -p "$sroot/etc"
	# It reports what it creates ("Creating user ..."): anything else fails.
	if systemd-sysusers --root="$sroot" "$sysusers" >"$tmp/out" 2>&1 &&
		! grep -v '^Creating \(user\|group\) ' "$tmp/out" >/dev/null; then
		echo "ok: systemd-sysusers"
	else
		fail "systemd-sysusers"
		sed 's/^/    /' "$tmp/out"
	fi
	pw=$(grep "^$sysuser:" "$sroot/etc/passwd" || true)
	home=$(echo "$pw" | cut -d: -f6)
	shell=$(echo "$pw" | cut -d: -f7)
	uid=$(echo "$pw" | cut -d: -f3)
	[ -n "$pw" ] && [ "$home" = /var/lib/turbokv ] && [ "$uid" -lt 1000 ] &&
		case $shell in */nologin|*/false) true ;; *) false ;; esac ||
		fail "sysusers: passwd entry is '$pw'"
	clean "systemd-tmpfiles --create" \
		systemd-tmpfiles --create --root="$sroot" "$tmpfiles"
	for want in "/etc/turbokv 0:0" "/var/cache/turbokv $uid:$uid" \
		"/var/cache/turbokv/models $uid:$uid"; do
		path=${want% *}
		got=$(stat -c '%u:%g' "$sroot$path" 2>/dev/null || echo missing)
		[ "$got" = "${want#* }" ] || fail "tmpfiles: $path is $got, want ${want#* }"
	done
fi

# --- 6. ExecStart names where this build installs turbokvd ----------------
installed=$build_root/meson-info/intro-installed.json
if [ -f "$installed" ]; then
	where=$(python3 -c 'import json, sys
for dst in json.load(open(sys.argv[1])).values():
    if dst.endswith("/turbokvd"):
        print(dst)' "$installed")
	if [ -z "$where" ]; then
		echo "note: this build installs no turbokvd yet; install path not compared"
	elif [ "$where" != "$sbindir/turbokvd" ]; then
		fail "turbokvd is installed to $where but the units run $sbindir/turbokvd"
	else
		echo "ok: ExecStart is the installed $where"
	fi
fi

# --- 7. turbokv-http's units ------------------------------------------------
if [ "$http" = yes ]; then
	mkdir -p "$root$bindir"
	printf '#!/bin/sh\nexit 0\n' >"$root$bindir/turbokv-http"
	chmod 755 "$root$bindir/turbokv-http"
	cp "$units/turbokv-http.service" "$units/turbokv-http.socket" "$root$systemdir/"
	clean "turbokv-http system units: systemd-analyze verify" \
		sys_verify "$systemdir/turbokv-http.service" "$systemdir/turbokv-http.socket"
	quiet_rc "turbokv-http system service: systemd-analyze security <= 2.0" \
		"$sa" security --offline=yes --threshold=20 --root="$root" \
		"$systemdir/turbokv-http.service"
	for u in turbokv-http.service turbokv-http.socket; do
		sed "s|^ExecStart=$bindir/turbokv-http|ExecStart=$root$bindir/turbokv-http|" \
			"$units/user/$u" >"$user/units/$u"
	done
	clean "turbokv-http user units: systemd-analyze --user verify" \
		user_sa verify --man=no "$user/units/turbokv-http.service" "$user/units/turbokv-http.socket"
	quiet_rc "turbokv-http user service: systemd-analyze --user security <= 7.0" \
		user_sa security --offline=yes --threshold=70 "$user/units/turbokv-http.service"
	[ "$(unit_get "$units/turbokv-http.service" SupplementaryGroups)" = "$sysuser" ] ||
		fail "turbokv-http.service is not in group $sysuser, which owns the daemon's socket"
	for f in "$units/turbokv-http.socket" "$units/user/turbokv-http.socket"; do
		case $(unit_get "$f" ListenStream) in
		127.0.0.1:* | "[::1]:"*) ;;
		*) fail "$f listens beyond loopback" ;;
		esac
	done
	echo "ok: turbokv-http units listen on loopback; the service may reach the daemon"
fi

exit "$failed"
