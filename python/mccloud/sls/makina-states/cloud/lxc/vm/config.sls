{#- The container's lxc configuration from the registry: the core renders
    the whole block (pillar mccloud:vm:lxc_config: network with the bridge,
    allocated MAC and IP, gateway; autostart; unset keys; mount entries; raw
    lxc_conf lines). It is written as <lxc_path>/<name>/mccloud.conf, which
    the container's config includes on its last line, after lxc-copy's own
    lxc.net.0.* lines (the fragment starts with `lxc.net =`, which clears
    them). The guest network configuration does not wait for DHCP. A running
    container restarts when its configuration changed; its cgroup limits
    (pillar mccloud:vm:limits:cgroup, the keys lxc-cgroup takes) are then
    set on the running container wherever they differ (provision and repair
    re-apply them without a restart). #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- for j in jobs %}
{%- set d, job_key, s = j.job, j.key, j.sfx %}
{%- set v = d.vm %}
{%- set dir = d.lxc_path ~ '/' ~ v.name %}
{%- set cfg = dir ~ '/config' %}
{%- set conf = dir ~ '/mccloud.conf' %}

mccloud-lxc-vm-config{{ s }}:
  file.managed:
    - failhard: true
    - name: {{ conf | tojson }}
    - contents_pillar: {{ job_key }}:vm:lxc_config
    - mode: '0644'
    - follow_symlinks: false

{#- Earlier versions appended a marked block to the config: it goes. So
    does an include of mccloud.conf that is not the last setting (anything
    after it would override the registry's values); the next state appends
    it again at the end. #}
mccloud-lxc-vm-config-legacy{{ s }}:
  file.replace:
    - failhard: true
    - name: {{ cfg | tojson }}
    - pattern: '^# mccloud settings .*|^lxc\.include = [^\n]*/mccloud\.conf\n(?=.*^[^#\s])'
    - repl: ''
    - flags: ['MULTILINE', 'DOTALL']
    - bufsize: file
    - backup: false
    - show_changes: true
    - require:
      - file: mccloud-lxc-vm-config{{ s }}

mccloud-lxc-vm-config-include{{ s }}:
  file.append:
    - failhard: true
    - name: {{ cfg | tojson }}
    - text: {{ ('lxc.include = ' ~ conf) | tojson }}
    - require:
      - file: mccloud-lxc-vm-config-legacy{{ s }}

mccloud-lxc-vm-restart{{ s }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        if ! lxc-info -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" -s | grep -q RUNNING; then
            echo "changed=no comment='container $MCCLOUD_NAME is not running: the next start reads the new configuration'"
            exit 0
        fi
        lxc-stop -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" -t 30
        log="$MCCLOUD_LXC_PATH/$MCCLOUD_NAME/lxc-start.log"
        lxc-start -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" -l ERROR -o "$log" || {
            rc=$?
            echo "lxc-start $MCCLOUD_NAME failed; its log ($log) says:" >&2
            grep -v -e 'lxc_start.c:main' -e wait_on_daemonized_start -e '__lxc_start' "$log" | tail -n 3 >&2
            exit "$rc"
        }
        lxc-wait -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" -s RUNNING -t 60 || exit $?
        echo "changed=yes comment='container $MCCLOUD_NAME restarted on its new configuration'"
    - env:
        MCCLOUD_LXC_PATH: {{ d.lxc_path | string | tojson }}
        MCCLOUD_NAME: {{ v.name | string | tojson }}
    - onchanges:
      - file: mccloud-lxc-vm-config{{ s }}
      - file: mccloud-lxc-vm-config-legacy{{ s }}
      - file: mccloud-lxc-vm-config-include{{ s }}

{%- set cgroup = (v.get('limits') or {}).get('cgroup') or {} %}
{%- if cgroup %}

mccloud-lxc-vm-limits{{ s }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        if ! lxc-info -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" -s | grep -q RUNNING; then
            echo "changed=no comment='container $MCCLOUD_NAME is not running: it starts with its limits'"
            exit 0
        fi
        # Two passes: on cgroup v1 memory + swap may not go below memory,
        # so raising and lowering each need their own order.
        changed=
        for pass in 1 2; do
            i=0; failed=
            while key=$(printenv "MCCLOUD_LIMIT_${i}_KEY"); do
                value=$(printenv "MCCLOUD_LIMIT_${i}_VALUE")
                i=$((i + 1))
                now=$(lxc-cgroup -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" "$key" 2>/dev/null) || now=
                [ "$now" = "$value" ] && continue
                if lxc-cgroup -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" "$key" "$value" 2>/dev/null; then
                    changed="$changed $key"
                elif [ "$pass" = 2 ]; then
                    echo "container $MCCLOUD_NAME: lxc-cgroup could not set $key to $value (it is $now)" >&2
                    failed=1
                fi
            done
            [ -z "$failed" ] || exit 1
        done
        if [ -n "$changed" ]; then
            echo "changed=yes comment='limits of $MCCLOUD_NAME set on the running container:$changed'"
        else
            echo "changed=no comment='limits of $MCCLOUD_NAME are in place'"
        fi
    - env:
        MCCLOUD_LXC_PATH: {{ d.lxc_path | string | tojson }}
        MCCLOUD_NAME: {{ v.name | string | tojson }}
{%- for key, value in cgroup | dictsort %}
        MCCLOUD_LIMIT_{{ loop.index0 }}_KEY: {{ key | string | tojson }}
        MCCLOUD_LIMIT_{{ loop.index0 }}_VALUE: {{ value | string | tojson }}
{%- endfor %}
    - require:
      - cmd: mccloud-lxc-vm-restart{{ s }}
{%- endif %}

mccloud-lxc-vm-guest-network{{ s }}:
  mccloud_rootfs.managed:
    - failhard: true
    - name: /etc/network/interfaces
    - root: {{ d.rootfs | string | tojson }}
    - contents: |
        # Managed by mccloud: LXC sets eth0's address from the container config.
        auto lo
        iface lo inet loopback

        auto eth0
        iface eth0 inet manual
{%- endfor %}
