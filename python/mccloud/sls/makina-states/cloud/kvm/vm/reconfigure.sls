{#- Reconfigure: the changed settings of an existing VM applied on its
    node: its domain files and taps (spawn.sls), its disk grown to its
    size (never shrunk; only while the guest is stopped: a running QEMU
    holds the disk's lock; the start state grows it before QEMU starts,
    so its next start, or a restart below, applies it), and a
    running guest whose argv or seed changed since it started is restarted
    (ACPI powerdown, 60 s, then SIGTERM), as lxc restarts a container whose
    configuration changed. A stopped guest stays stopped (initial_setup
    starts it). Data: as spawn (vm.disk_mib: the size in MiB). #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- from "makina-states/cloud/kvm/vm/qemu.jinja" import start_state, IS_GUEST with context %}
include:
  - makina-states.cloud.kvm.vm.spawn
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}
{%- set v = d.vm %}
{%- set dom = d.get('domain') or {} %}
{%- if dom %}

mccloud-kvm-vm-stop-stale{{ s }}:
  mccloud_kvm.stopped:
    - failhard: true
    - name: {{ v.name | string | tojson }}
    - dir: {{ d.dir | string | tojson }}
    - timeout: 60
    - stale_only: true
    - require:
      - cmd: mccloud-kvm-vm-argv{{ s }}
      - cmd: mccloud-kvm-vm-taps{{ s }}

mccloud-kvm-vm-grow{{ s }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        want=$((MCCLOUD_DISK_MIB * 1048576))
        if [ "$want" -le 0 ]; then echo "changed=no comment='no disk size to grow to'"; exit 0; fi
        {{ IS_GUEST | indent(8) }}
        pid=$(cat "$MCCLOUD_PIDFILE" 2>/dev/null)
        if is_guest "$pid" "$MCCLOUD_NAME" "$MCCLOUD_PIDFILE"; then
            echo "changed=no comment='guest $MCCLOUD_NAME is running: its disk grows at its next start (mc_cloud_kvm.vm_stop, then vm_start)'"; exit 0
        fi
        have=$(qemu-img info --output=json "$MCCLOUD_DISK" | sed -n 's/^ *"virtual-size": *\([0-9]*\).*/\1/p' | head -n 1)
        [ -n "$have" ] || { echo "cannot read the size of $MCCLOUD_DISK" >&2; exit 1; }
        if [ "$have" -ge "$want" ]; then echo "changed=no comment='disk of $MCCLOUD_NAME has $have bytes'"; exit 0; fi
        qemu-img resize -q "$MCCLOUD_DISK" "$want" || exit $?
        echo "changed=yes comment='disk of $MCCLOUD_NAME grown from $have to $want bytes'"
    - env:
        MCCLOUD_NAME: {{ v.name | string | tojson }}
        MCCLOUD_DISK: {{ dom.disk | string | tojson }}
        MCCLOUD_PIDFILE: {{ dom.pidfile | string | tojson }}
        MCCLOUD_DISK_MIB: {{ (v.get('disk_mib') or 0) | int | string | tojson }}
    - require:
      - cmd: mccloud-kvm-vm-disk{{ s }}
      - mccloud_kvm: mccloud-kvm-vm-stop-stale{{ s }}
{{ start_state('mccloud-kvm-vm-restarted', d, s, requires=[{'cmd': 'mccloud-kvm-vm-grow' ~ s}],
               onchanges=[{'mccloud_kvm': 'mccloud-kvm-vm-stop-stale' ~ s}]) }}
{%- endif %}
{%- endfor %}
