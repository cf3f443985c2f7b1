#!/bin/sh
# The main job: set up (scripts/setup.sh), make sure turbokvd is running for
# this user, and ask it a question through the turbokv client.
#
#   scripts/ask.sh "What is the capital of France? Answer in one sentence."
#
# When no daemon answers on the default socket, one is started in the
# background (log: ~/.cache/turbokv/turbokvd.log) and keeps running for the
# next question; stop it with `pkill -x turbokvd`, or run it under systemd
# instead (docs/systemd.md). Extra arguments go to `turbokv ask`.
set -eu

cd "$(dirname "$0")/.."
scripts/setup.sh

client=build/clients/turbokv
if ! "$client" status >/dev/null 2>&1; then
	log=${XDG_CACHE_HOME:-$HOME/.cache}/turbokv/turbokvd.log
	mkdir -p "$(dirname "$log")"
	echo "starting turbokvd (log: $log)" >&2
	nohup build/daemon/turbokvd >"$log" 2>&1 &
	pid=$!
	tries=0
	until "$client" status >/dev/null 2>&1; do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "turbokvd exited; its log:" >&2
			cat "$log" >&2
			exit 1
		fi
		tries=$((tries + 1))
		if [ "$tries" -gt 600 ]; then
			echo "turbokvd did not become ready in 60 s (log: $log)" >&2
			exit 1
		fi
		sleep 0.1
	done
fi
exec "$client" ask "$@"
