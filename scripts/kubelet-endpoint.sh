# kubelet-endpoint.sh — where kubelet reads its CRI endpoint, and one change there that points it at
# koord-runtime-proxy (or back). Sourced by scripts/install-baremetal.sh and scripts/uninstall.sh; bash only, no
# Python (a node of the root-tree install has none).
#
# kubelet takes its endpoint from, in rising precedence: its --config KubeletConfiguration file
# (`containerRuntimeEndpoint:`), the files of its --config-dir (later ones win), and the --container-runtime-endpoint
# flag (command-line flags win over every file; of a flag given twice, the last one). Under systemd its command line is
# the unit's ExecStart with $VARS from Environment= and EnvironmentFile= (a file wins over Environment=, whatever the
# order). kubeadm's packages run `kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS
# $KUBELET_EXTRA_ARGS` (10-kubeadm.conf), KUBELET_EXTRA_ARGS from /etc/default/kubelet (deb) or
# /etc/sysconfig/kubelet (rpm), shipped as an empty `KUBELET_EXTRA_ARGS=` that overrides any drop-in's Environment=.
#
# ke_plan reads all that (under $root) and picks the one place that decides, without changing anything:
#   config    the --config file (or the last --config-dir file that sets containerRuntimeEndpoint), when no flag
#             sets the endpoint: its containerRuntimeEndpoint line is set (or added)
#   envfile   the EnvironmentFile that defines KUBELET_EXTRA_ARGS, when a flag must win (one is already given,
#             or there is no config file): the flag goes into that line, an older one replaced
#   drop-in   our kubelet drop-in's Environment=KUBELET_EXTRA_ARGS=..., when nothing else defines the variable
# ke_apply makes that change and records what was there (ke_record_dir); ke_revert puts exactly that back.
# Callers set: root (files under it), dry_run (0/1) and log() (a line to stdout).

KE_ENDPOINT=unix:///var/run/koord-runtimeproxy/runtimeproxy.sock
KE_DROP_IN=/etc/systemd/system/kubelet.service.d/10-koord-runtime-proxy.conf
KE_DROP_IN_LINE="Environment=\"KUBELET_EXTRA_ARGS=--container-runtime-endpoint=$KE_ENDPOINT\""
# The record of the change: place, file (as kubelet sees it), after (the line written) and, when there was one,
# before (the line it replaced). In the proxy's state directory, which uninstall --purge removes last.
KE_RECORD=/var/lib/koord-runtimeproxy/kubelet-endpoint
KE_UNIT_DIRS=(/etc/systemd/system /run/systemd/system /usr/local/lib/systemd/system /usr/lib/systemd/system
              /lib/systemd/system)

# ke_words STRING: split as systemd splits a command line or an Environment= value (whitespace; "..." with
# backslash escapes; '...'), one word a line.
ke_words() {
  local s=$1 i=0 n=${#1} c quote="" word="" any=0
  while [ "$i" -lt "$n" ]; do
    c=${s:i:1}
    if [ -n "$quote" ]; then
      if [ "$c" = "$quote" ]; then quote=""
      elif [ "$c" = '\' ] && [ "$quote" = '"' ] && [ $((i + 1)) -lt "$n" ]; then i=$((i + 1)); word+=${s:i:1}
      else word+=$c; fi
    else
      case $c in
        ' '|$'\t') [ "$any" = 0 ] || printf '%s\n' "$word"; word="" any=0 ;;
        '"'|"'") quote=$c any=1 ;;
        '\') i=$((i + 1)); word+=${s:i:1}; any=1 ;;
        *) word+=$c any=1 ;;
      esac
    fi
    i=$((i + 1))
  done
  [ "$any" = 0 ] || printf '%s\n' "$word"
}

# ke_unquote VALUE: an environment file's value as systemd reads it (one pair of surrounding quotes removed).
ke_unquote() {
  local v=$1
  v=${v#"${v%%[![:space:]]*}"}; v=${v%"${v##*[![:space:]]}"}
  if [[ $v == \"*\" && ${#v} -ge 2 ]] || [[ $v == \'*\' && ${#v} -ge 2 ]]; then v=${v:1:${#v}-2}; fi
  printf '%s' "$v"
}

# ke_service_lines FILE: the KEY=VALUE lines of a unit file's [Service] section, continuation lines joined.
ke_service_lines() {
  local line joined="" section=""
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line#"${line%%[![:space:]]*}"}
    if [ -n "$joined" ]; then line="$joined $line"; joined=""; fi
    if [[ $line == *\\ ]]; then joined=${line%\\}; continue; fi
    case $line in ''|'#'*|';'*) continue ;; '['*']') section=$line; continue ;; esac
    [ "$section" != "[Service]" ] || printf '%s\n' "$line"
  done <"$1"
}

# ke_unit_files: kubelet.service, then its drop-ins in the order systemd applies them (by name; a name in /etc hides
# the same name further down), each as a path under $root. Nothing when there is no kubelet.service.
ke_unit_files() {
  local dir f name unit=""
  for dir in "${KE_UNIT_DIRS[@]}"; do
    if [ -f "$root$dir/kubelet.service" ]; then unit=$root$dir/kubelet.service; break; fi
  done
  [ -n "$unit" ] || return 0
  echo "$unit"
  local -A first=()
  for dir in "${KE_UNIT_DIRS[@]}"; do
    for f in "$root$dir"/kubelet.service.d/*.conf; do
      [ -f "$f" ] || continue
      name=${f##*/}
      [ -n "${first[$name]:-}" ] || first[$name]=$f
    done
  done
  [ ${#first[@]} = 0 ] || printf '%s\n' "${!first[@]}" | LC_ALL=C sort | while IFS= read -r name; do
    echo "${first[$name]}"; done
}

# ke_config_line FILE: the top-level containerRuntimeEndpoint line of a KubeletConfiguration (YAML), if any.
ke_config_line() { grep -m1 -E '^containerRuntimeEndpoint:' "$1" 2>/dev/null || true; }
# ke_config_value LINE: its value, quotes removed.
ke_config_value() { ke_unquote "${1#containerRuntimeEndpoint:}"; }

# ke_plan: sets ke_place (config, envfile or drop-in), ke_file (the file to change, as kubelet sees it), ke_before
# (its line now, or empty: none) and ke_after (the line that points kubelet at the proxy); ke_note says why.
# Returns 1 with ke_error set when no single change can make kubelet use the proxy.
ke_plan() {
  ke_place="" ke_file="" ke_before="" ke_after="" ke_note="" ke_error=""
  local files file line key value word name
  mapfile -t files < <(ke_unit_files)
  if [ ${#files[@]} = 0 ]; then
    ke_place=drop-in ke_file=$KE_DROP_IN ke_after=$KE_DROP_IN_LINE
    ke_note="no kubelet.service here yet: the drop-in's KUBELET_EXTRA_ARGS (kubeadm's unit passes it)"
    return 0
  fi
  # The unit as systemd reads it: Environment= (a variable, the file setting it), EnvironmentFile= (in order),
  # the last ExecStart=.
  local -A env=() env_from=()
  local -a env_files=()
  local exec_start="" exec_from=""
  for file in "${files[@]}"; do
    while IFS= read -r line; do
      key=${line%%=*} value=${line#*=}
      key=${key%"${key##*[![:space:]]}"}; value=${value#"${value%%[![:space:]]*}"}
      case $key in
        Environment)
          if [ -z "$value" ]; then env=() env_from=(); continue; fi
          while IFS= read -r word; do
            [[ $word == *=* ]] || continue
            env[${word%%=*}]=${word#*=} env_from[${word%%=*}]=${file#"$root"}
          done < <(ke_words "$value") ;;
        EnvironmentFile) if [ -z "$value" ]; then env_files=(); else env_files+=("${value#-}"); fi ;;
        ExecStart) exec_start=$value exec_from=${file#"$root"} ;;
      esac
    done < <(ke_service_lines "$file")
  done
  for file in "${env_files[@]}"; do
    [ -f "$root$file" ] || continue
    while IFS= read -r line; do
      line=${line#"${line%%[![:space:]]*}"}
      [[ $line =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || continue
      env[${BASH_REMATCH[1]}]=$(ke_unquote "${BASH_REMATCH[2]}") env_from[${BASH_REMATCH[1]}]=$file
    done <"$root$file"
  done
  if [ -z "$exec_start" ]; then
    ke_error="kubelet.service has no ExecStart= (${files[*]})"
    return 1
  fi
  # kubelet's arguments, each with the ExecStart word it came from: $VAR alone is split at whitespace, ${VAR}
  # inside a word is not.
  local -a args=() arg_word=() words=()
  mapfile -t words < <(ke_words "$exec_start")
  words[0]=${words[0]#[-@:+!]}; words[0]=${words[0]#[-@:+!]}
  local i extra_at=-1
  for i in "${!words[@]}"; do
    word=${words[$i]}
    [[ ! $word =~ ^\$\{?KUBELET_EXTRA_ARGS\}?$ ]] || extra_at=$i
    if [[ $word =~ ^\$([A-Za-z_][A-Za-z0-9_]*)$ ]]; then
      while IFS= read -r value; do args+=("$value"); arg_word+=("$i"); done < <(ke_words "${env[${BASH_REMATCH[1]}]:-}")
    else
      while [[ $word =~ \$\{([A-Za-z_][A-Za-z0-9_]*)\} ]]; do
        word=${word/"${BASH_REMATCH[0]}"/${env[${BASH_REMATCH[1]}]:-}}
      done
      args+=("$word"); arg_word+=("$i")
    fi
  done
  # The flags that matter: --config, --config-dir, and the last --container-runtime-endpoint (pflag: last wins).
  local config="" config_dir="" flag="" flag_word=-1
  for i in "${!args[@]}"; do
    case ${args[$i]} in
      --config=*) config=${args[$i]#*=} ;;
      --config) config=${args[$((i + 1))]:-} ;;
      --config-dir=*) config_dir=${args[$i]#*=} ;;
      --config-dir) config_dir=${args[$((i + 1))]:-} ;;
      --container-runtime-endpoint=*) flag=${args[$i]#*=} flag_word=${arg_word[$i]} ;;
      --container-runtime-endpoint) flag=${args[$((i + 1))]:-} flag_word=${arg_word[$i]} ;;
    esac
  done
  if [ -n "$flag" ]; then
    # A flag wins over every file: ours must come after it, in KUBELET_EXTRA_ARGS.
    if [ "$extra_at" -lt "$flag_word" ]; then
      ke_error="kubelet's --container-runtime-endpoint=$flag comes from '${words[$flag_word]}' in $exec_from's ExecStart and no \$KUBELET_EXTRA_ARGS follows it: set --container-runtime-endpoint=$KE_ENDPOINT there by hand"
      return 1
    fi
    ke_note="a flag sets kubelet's endpoint ($flag): flags win over its config file"
  else
    # No flag: the last --config-dir file that sets the field, else the --config file.
    local chosen=""
    if [ -n "$config_dir" ] && [ -d "$root$config_dir" ]; then
      for file in "$root$config_dir"/*.conf; do
        [ -f "$file" ] && [ -n "$(ke_config_line "$file")" ] && chosen=${file#"$root"}
      done
    fi
    [ -n "$chosen" ] || { [ -z "$config" ] || [ ! -f "$root$config" ] || chosen=$config; }
    if [ -n "$chosen" ]; then
      if [[ $(grep -m1 -v -E '^[[:space:]]*(#|$)' "$root$chosen") =~ ^[[:space:]]*\{ ]]; then
        ke_error="$chosen is JSON: set \"containerRuntimeEndpoint\": \"$KE_ENDPOINT\" in it by hand"
        return 1
      fi
      ke_place=config ke_file=$chosen ke_before=$(ke_config_line "$root$chosen")
      ke_after="containerRuntimeEndpoint: $KE_ENDPOINT"
      ke_note="kubelet reads its endpoint from $chosen (no --container-runtime-endpoint flag)"
      return 0
    fi
    if [ "$extra_at" -lt 0 ]; then
      ke_error="kubelet's command line ($exec_from) has neither --config nor \$KUBELET_EXTRA_ARGS: set --container-runtime-endpoint=$KE_ENDPOINT there by hand"
      return 1
    fi
    ke_note="kubelet has no config file: the flag"
  fi
  # The flag goes where KUBELET_EXTRA_ARGS is defined: an environment file (which wins over any Environment=),
  # else our drop-in. An Environment= of someone else's would be overridden or override ours: not ours to change.
  local from=${env_from[KUBELET_EXTRA_ARGS]:-}
  if [ -n "$from" ] && [ "$from" != "$KE_DROP_IN" ] && [[ " ${env_files[*]} " == *" $from "* ]]; then
    ke_place=envfile ke_file=$from
    ke_before=$(grep -E '^[[:space:]]*KUBELET_EXTRA_ARGS=' "$root$from" | tail -1)
    ke_after=$(ke_extra_args_line "$ke_before")
    ke_note+="; KUBELET_EXTRA_ARGS comes from $from, which wins over any drop-in's Environment="
  elif [ -n "$from" ] && [ "$from" != "$KE_DROP_IN" ]; then
    ke_error="KUBELET_EXTRA_ARGS is set by Environment= in $from: add --container-runtime-endpoint=$KE_ENDPOINT to it by hand"
    return 1
  else
    ke_place=drop-in ke_file=$KE_DROP_IN ke_after=$KE_DROP_IN_LINE
    ke_note+="; nothing else defines KUBELET_EXTRA_ARGS: the drop-in's Environment="
  fi
}

# ke_extra_args_line LINE: KUBELET_EXTRA_ARGS=... with any --container-runtime-endpoint taken out and ours added,
# the rest of the value as it was.
ke_extra_args_line() {
  local value
  value=$(ke_unquote "${1#*=}")
  while [[ $value =~ (^|[[:space:]])--container-runtime-endpoint(=|[[:space:]]+)[^[:space:]]+ ]]; do
    value=${value/"${BASH_REMATCH[0]}"/}
  done
  value=${value#"${value%%[![:space:]]*}"}
  printf 'KUBELET_EXTRA_ARGS="%s"' "${value:+$value }--container-runtime-endpoint=$KE_ENDPOINT"
}

# ke_flag_value LINE: the value of the last --container-runtime-endpoint in an environment file's line.
ke_flag_value() {
  local word value="" next=0
  while IFS= read -r word; do
    if [ "$next" = 1 ]; then value=$word next=0; fi
    case $word in
      --container-runtime-endpoint=*) value=${word#*=} ;;
      --container-runtime-endpoint) next=1 ;;
    esac
  done < <(ke_words "$(ke_unquote "${1#*=}")")
  printf '%s' "$value"
}

# ke_done: whether the planned place already points kubelet at the proxy.
ke_done() {
  case $ke_place in
    config) [ "$(ke_config_value "$ke_before")" = "$KE_ENDPOINT" ] ;;
    envfile) [ "$(ke_flag_value "$ke_before")" = "$KE_ENDPOINT" ] ;;
    drop-in) [ -f "$root$KE_DROP_IN" ] && grep -qxF -- "$KE_DROP_IN_LINE" "$root$KE_DROP_IN" ;;
  esac
}

# ke_replace_line FILE OLD NEW: FILE with its line OLD replaced by NEW (OLD empty: NEW appended; NEW empty: OLD
# deleted), written to a new file that takes the old one's mode and owner, then renamed over it.
ke_replace_line() {
  local file=$1 old=$2 new=$3 tmp line done=0
  tmp=$(mktemp "$file.koord.XXXXXX")
  {
    while IFS= read -r line || [ -n "$line" ]; do
      if [ "$done" = 0 ] && [ -n "$old" ] && [ "$line" = "$old" ]; then
        done=1
        [ -z "$new" ] || printf '%s\n' "$new"
      else
        printf '%s\n' "$line"
      fi
    done <"$file"
    [ -n "$old" ] || printf '%s\n' "$new"
  } >"$tmp"
  chmod --reference="$file" "$tmp" && chown --reference="$file" "$tmp"
  mv -f "$tmp" "$file"
}

# ke_check_record: 1 (ke_error) when an earlier install changed another place than the one planned now.
ke_check_record() {
  local rec=$root$KE_RECORD
  if [ -f "$rec/file" ] && { [ "$(cat "$rec/place")" != "$ke_place" ] || [ "$(cat "$rec/file")" != "$ke_file" ]; }; then
    ke_error="an earlier install pointed kubelet at the proxy in $(cat "$rec/file") ($(cat "$rec/place")), but kubelet now reads its endpoint from $ke_file: run scripts/uninstall.sh (it puts $(cat "$rec/file") back) and install again"
    return 1
  fi
}

# ke_apply: make the planned change (drop-in: the caller installs the drop-in with its Environment= line) and keep
# its record. Refuses (1, ke_error) when an earlier install changed another place.
ke_apply() {
  local rec=$root$KE_RECORD
  ke_check_record || return 1
  if ke_done; then
    log "kubelet's endpoint: unchanged, $ke_file names the proxy ($ke_note)"
    if [ ! -f "$rec/file" ] && [ "$ke_place" != drop-in ]; then
      log "note: no record of what $ke_file said before (set before this install): uninstall leaves it to you"
      return 0
    fi
  else
    if [ "$dry_run" = 1 ]; then
      log "would point kubelet at the proxy in $ke_file ($ke_note): '${ke_before:-(no such line)}' -> '$ke_after'"
      return 0
    fi
    [ "$ke_place" = drop-in ] || ke_replace_line "$root$ke_file" "$ke_before" "$ke_after"
    log "kubelet's endpoint: $ke_file now says '$ke_after' (was: '${ke_before:-(no such line)}'; $ke_note)"
  fi
  [ "$dry_run" = 0 ] || return 0
  [ ! -f "$rec/file" ] || return 0
  mkdir -p "$rec"
  printf '%s\n' "$ke_place" >"$rec/place"
  printf '%s\n' "$ke_after" >"$rec/after"
  if [ -n "$ke_before" ]; then printf '%s\n' "$ke_before" >"$rec/before"; fi
  printf '%s\n' "$ke_file" >"$rec/file"
}

# ke_recorded: sets ke_place, ke_file, ke_before, ke_after from the record; 1 when there is none.
ke_recorded() {
  local rec=$root$KE_RECORD
  [ -f "$rec/file" ] || return 1
  ke_place=$(cat "$rec/place") ke_file=$(cat "$rec/file") ke_after=$(cat "$rec/after")
  ke_before=$(cat "$rec/before" 2>/dev/null || true)
}

# ke_revert: put back what the recorded change replaced (the drop-in itself is the caller's to remove); the record
# goes. Refuses (1, ke_error) when that line was changed since.
ke_revert() {
  ke_recorded || return 0
  local target=$root$ke_file
  if [ "$ke_place" != drop-in ]; then
    if [ -f "$target" ] && grep -qxF -- "$ke_after" "$target"; then
      if [ "$dry_run" = 1 ]; then
        log "would put back $target: '$ke_after' -> '${ke_before:-(line removed)}'"
        return 0
      fi
      ke_replace_line "$target" "$ke_after" "$ke_before"
      log "kubelet's endpoint: $target says '${ke_before:-(no such line)}' again (was: '$ke_after')"
    elif [ -f "$target" ] && grep -q koord-runtimeproxy "$target"; then
      ke_error="$target: the line the install wrote ('$ke_after') was changed since; set containerd's socket there by hand (it said '${ke_before:-nothing}'), then run this again"
      return 1
    else
      log "kubelet's endpoint: $target no longer names the proxy (changed by hand); nothing to put back"
    fi
  fi
  if [ "$dry_run" = 1 ]; then log "would remove: $root$KE_RECORD"; else rm -rf -- "$root$KE_RECORD"; fi
}
