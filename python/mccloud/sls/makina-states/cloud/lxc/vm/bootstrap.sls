{#- Makes the container a minion: Salt comes from its image when the image
    carries it, else the node's wheelhouse is copied in (tar through
    lxc-attach); then the bootstrap script runs inside the container with
    the VM's script_args (split into words, never evaluated) and starts
    the minion's service. The generic bootstrap SLS placed the
    configuration, keys and script before. Data: pillar mccloud (vm,
    lxc_path, minion, wheelhouse). #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
include:
  - makina-states.cloud.generic.vm.bootstrap
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}
{%- set m = d.minion %}

mccloud-lxc-vm-bootstrap{{ s }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        set -f
        attach() {
            lxc-attach -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" --clear-env \
                --set-var PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin -- "$@"
        }
        fail() { echo "changed=no comment='$(printf %s "$1" | tr -d "'")'"; exit "${2:-1}"; }
        if ! attach test -x "$MCCLOUD_PREFIX/bin/salt-minion"; then
            [ -f "$MCCLOUD_WHEELHOUSE/SALT_VERSION" ] || fail "Salt is not in the image of $MCCLOUD_NAME and this node has no wheelhouse at $MCCLOUD_WHEELHOUSE: run mc_cloud_controller.wheelhouse, then deploy the node" 3
            attach mkdir -p "$MCCLOUD_GUEST_WHEELHOUSE" || fail "cannot enter container $MCCLOUD_NAME (is it running?)"
            tar -C "$MCCLOUD_WHEELHOUSE" -cf - . | attach tar -C "$MCCLOUD_GUEST_WHEELHOUSE" -xf - \
                || fail "copying the wheelhouse into $MCCLOUD_NAME failed"
        fi
        err=$(mktemp)
        attach /bin/sh /usr/local/sbin/mccloud-bootstrap-salt $MCCLOUD_SCRIPT_ARGS 2>"$err" >&2
        rc=$?
        cat "$err" >&2
        if [ "$rc" -ne 0 ]; then
            msg=$(tail -n 1 "$err"); rm -f "$err"
            fail "bootstrap in $MCCLOUD_NAME failed (exit $rc): $msg" "$rc"
        fi
        msg=$(tail -n 1 "$err" | sed 's/^mccloud-bootstrap: //' | tr -d "'"); rm -f "$err"
        echo "changed=yes comment='$MCCLOUD_NAME bootstrapped: $msg'"
    - env:
        MCCLOUD_LXC_PATH: {{ d.lxc_path | string | tojson }}
        MCCLOUD_NAME: {{ d.vm.name | string | tojson }}
        MCCLOUD_MODE: {{ m.mode | string | tojson }}
        MCCLOUD_PREFIX: {{ m.prefix | string | tojson }}
        MCCLOUD_WHEELHOUSE: {{ d.wheelhouse | string | tojson }}
        MCCLOUD_GUEST_WHEELHOUSE: {{ m.wheelhouse | string | tojson }}
        MCCLOUD_SCRIPT_ARGS: {{ m.script_args | string | tojson }}
    - require:
      - mccloud_rootfs: mccloud-vm-minion-config{{ s }}
      - mccloud_rootfs: mccloud-vm-minion-pem{{ s }}
      - mccloud_rootfs: mccloud-vm-minion-pub{{ s }}
      - mccloud_rootfs: mccloud-vm-minion-master-pub{{ s }}
      - mccloud_rootfs: mccloud-vm-bootstrap-script{{ s }}
{%- endfor %}
