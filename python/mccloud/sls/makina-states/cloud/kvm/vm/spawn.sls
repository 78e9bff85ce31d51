{#- Spawn: the VM's directory on its node (<kvm_path>/vms/<vm>, 0700), its
    disk (a qcow2 overlay of its image's versioned base, at the VM's size),
    the staging tree of its seed (seed-root, 0700: the generic VM SLS write
    the guest's files there), a tap per NIC on the node's bridge, and its
    domain files: domain.json (the core's rendering) and qemu.argv (the
    argv, NUL-separated: what the node's boot service starts). The guest
    is NOT started: its first boot is at initial_setup, once its seed is
    complete. Running it again changes nothing. Commands receive the data
    through their environment only (the argv as MCCLOUD_ARG_<n>).
    Data: the job's (vm, dir, kvm_path, rootfs, domain, bridge). #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- from "makina-states/cloud/kvm/vm/qemu.jinja" import argv_env, REBUILD_ARGV with context %}
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}
{%- set v = d.vm %}
{%- set dom = d.get('domain') or {} %}
{%- set name = v.name | string %}
{%- set ok_dir = dom and (d.dir | string) == (d.kvm_path | string) ~ '/vms/' ~ name and (dom.dir | string) == (d.dir | string)
                 and (d.kvm_path | string).startswith('/') and '/' not in name and name not in ['', '.', '..'] %}

mccloud-kvm-vm-domain{{ s }}:
  test.configurable_test_state:
    - failhard: true
    - name: the VM has its domain, in its own directory
    - changes: false
    - result: {{ (ok_dir and true or false) | tojson }}
    - allow_test_mode_failure: true
    - comment: {{ (('the domain of ' ~ name ~ ' lives in ' ~ d.dir) if ok_dir else
                   ('kvm VM ' ~ name ~ ': its settings have no domain (QEMU argv and paths), or its directory is not '
                    ~ '<kvm_path>/vms/<vm>: this mccloud core does not render kvm VMs; upgrade it, then provision again'))
                  | tojson }}

mccloud-kvm-vm-dir{{ s }}:
  file.directory:
    - failhard: true
    - name: {{ d.dir | string | tojson }}
    - makedirs: true
    - mode: '0700'
    - require:
      - test: mccloud-kvm-vm-domain{{ s }}

mccloud-kvm-vm-seed-root{{ s }}:
  file.directory:
    - failhard: true
    - name: {{ d.rootfs | string | tojson }}
    - mode: '0700'
    - require:
      - file: mccloud-kvm-vm-dir{{ s }}

mccloud-kvm-vm-disk{{ s }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        if [ -e "$MCCLOUD_DISK" ]; then echo "changed=no comment='disk $MCCLOUD_DISK exists'"; exit 0; fi
        if [ ! -f "$MCCLOUD_BASE" ]; then
            echo "the image of $MCCLOUD_NAME is not on this node ($MCCLOUD_BASE): run mc_cloud_kvm.sync_images" >&2
            exit 1
        fi
        umask 077
        qemu-img create -q -f qcow2 -F qcow2 -b "$MCCLOUD_BASE" "$MCCLOUD_DISK.new" "$MCCLOUD_SIZE" || exit $?
        mv "$MCCLOUD_DISK.new" "$MCCLOUD_DISK" || exit $?
        echo "changed=yes comment='disk $MCCLOUD_DISK made ($MCCLOUD_SIZE over $MCCLOUD_BASE)'"
    - env:
        MCCLOUD_NAME: {{ name | tojson }}
        MCCLOUD_DISK: {{ (dom.get('disk') or '') | string | tojson }}
        MCCLOUD_BASE: {{ (dom.get('base') or '') | string | tojson }}
        MCCLOUD_SIZE: {{ (v.get('size') or '10G') | string | tojson }}
    - require:
      - file: mccloud-kvm-vm-dir{{ s }}

mccloud-kvm-vm-taps{{ s }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        set -f
        changed=no
        valid() { case "$1" in ''|*[!A-Za-z0-9_.-]*) return 1 ;; esac; [ "$(printf %s "$1" | wc -c)" -le 15 ]; }
        valid "$MCCLOUD_BRIDGE" || { echo "bridge name $MCCLOUD_BRIDGE is not an interface name" >&2; exit 1; }
        ip link show "$MCCLOUD_BRIDGE" >/dev/null 2>&1 ||
            { echo "the node has no bridge $MCCLOUD_BRIDGE: deploy it (mc_cloud_kvm.install_vt)" >&2; exit 1; }
        set --
        i=0
        while tap=$(printenv "MCCLOUD_TAP_$i"); do
            valid "$tap" || { echo "tap name $tap is not an interface name" >&2; exit 1; }
            if ! ip link show "$tap" >/dev/null 2>&1; then
                ip tuntap add dev "$tap" mode tap || exit $?
                changed=yes
            fi
            if ! ip -o link show "$tap" | grep -qF -e " master $MCCLOUD_BRIDGE " || ! ip -o link show "$tap" | grep -q ',UP'; then
                ip link set "$tap" master "$MCCLOUD_BRIDGE" up || exit $?
                changed=yes
            fi
            set -- "$@" "$tap"
            i=$((i + 1))
        done
        printf '%s\n' "$@" > "$MCCLOUD_DIR/taps.new" && printf '%s\n' "$MCCLOUD_BRIDGE" > "$MCCLOUD_DIR/bridge.new" || exit 1
        for f in taps bridge; do
            if cmp -s "$MCCLOUD_DIR/$f.new" "$MCCLOUD_DIR/$f"; then rm -f "$MCCLOUD_DIR/$f.new"
            else mv "$MCCLOUD_DIR/$f.new" "$MCCLOUD_DIR/$f"; changed=yes; fi
        done
        echo "changed=$changed comment='taps $* on $MCCLOUD_BRIDGE'"
    - env:
        MCCLOUD_DIR: {{ d.dir | string | tojson }}
        MCCLOUD_BRIDGE: {{ d.bridge | string | tojson }}
{%- for nic in dom.get('nics') or [] %}
        MCCLOUD_TAP_{{ loop.index0 }}: {{ nic.tap | string | tojson }}
{%- endfor %}
    - require:
      - file: mccloud-kvm-vm-dir{{ s }}

mccloud-kvm-vm-domain-json{{ s }}:
  file.managed:
    - failhard: true
    - name: {{ (d.dir ~ '/domain.json') | tojson }}
    - contents: {{ (dom | tojson) | tojson }}
    - mode: '0600'
    - require:
      - file: mccloud-kvm-vm-dir{{ s }}

mccloud-kvm-vm-argv{{ s }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        {{ REBUILD_ARGV }}
        [ "$#" -gt 0 ] || { echo "the domain of $MCCLOUD_NAME has no argv" >&2; exit 1; }
        umask 077
        printf '%s\0' "$@" > "$MCCLOUD_DIR/qemu.argv.new" || exit 1
        if cmp -s "$MCCLOUD_DIR/qemu.argv.new" "$MCCLOUD_DIR/qemu.argv"; then
            rm -f "$MCCLOUD_DIR/qemu.argv.new"
            echo "changed=no comment='argv of $MCCLOUD_NAME unchanged'"; exit 0
        fi
        mv "$MCCLOUD_DIR/qemu.argv.new" "$MCCLOUD_DIR/qemu.argv" || exit 1
        echo "changed=yes comment='argv of $MCCLOUD_NAME written ($# arguments)'"
    - env:
        MCCLOUD_NAME: {{ name | tojson }}
        MCCLOUD_DIR: {{ d.dir | string | tojson }}
{{- argv_env(dom) }}
    - require:
      - file: mccloud-kvm-vm-dir{{ s }}

mccloud-kvm-vm-autostart{{ s }}:
{%- if v.get('autostart', true) %}
  file.managed:
    - contents: "started at the node's boot by the mccloud-kvm service\n"
{%- else %}
  file.absent:
{%- endif %}
    - failhard: true
    - name: {{ (d.dir ~ '/autostart') | tojson }}
    - require:
      - file: mccloud-kvm-vm-dir{{ s }}
{%- endfor %}
