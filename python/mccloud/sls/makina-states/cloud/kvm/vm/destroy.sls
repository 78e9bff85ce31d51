{#- Destroy: the VM's guest stopped at once (SIGTERM, then SIGKILL: its
    disk is removed right after, a clean shutdown would gain nothing), its taps deleted (every interface named with
    its tap prefix), its directory removed (disk, seed, domain files). Only
    the VM's own directory <kvm_path>/vms/<vm> is ever removed: the path
    is checked here and again by the command. Data: pillar mccloud:destroy
    (name, kvm_path, dir, tap_prefix; stop_timeout, seconds of ACPI powerdown
    before SIGTERM, default 0), given to the command through its
    environment. Applied in one job with the node's reverse proxy, hosts
    and firewall (pillar mccloud: the node's settings without the VM). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job.destroy %}
{%- set name, kvm_path, dir = d.name | string, (d.kvm_path | string).rstrip('/'), (d.dir | string).rstrip('/') %}
{%- set ok = dir == kvm_path ~ '/vms/' ~ name and kvm_path.startswith('/')
             and '/' not in name and name not in ['', '.', '..'] and '/../' not in dir ~ '/' %}
{#- The VM's directory is looked for under its kvm path, then every other
    one the node knows (the data's kvm_paths, /etc/mccloud/kvm-paths, the
    default): a VM no longer declared, or whose kvm path changed, is found
    where it lives. Found nowhere while a QEMU named after it runs: the
    destroy fails (nothing is freed) rather than leave it running. #}
{%- set where = {'dir': none, 'guests': []} %}
{%- if ok %}
{%- set where = salt['mc_cloud_kvm.locate'](name, [kvm_path] + ((d.get('kvm_paths') or []) | map('string') | list)) %}
{%- if where.dir %}
{%- set dir = where.dir | string %}
{%- set kvm_path = dir[:-(('/vms/' ~ name) | length)] %}
{%- endif %}
{%- endif %}
{%- set lost = ok and not where.dir and where.guests %}
mccloud-kvm-vm-destroy-path:
  test.configurable_test_state:
    - failhard: true
    - name: the VM's directory is its own
    - changes: false
    - result: {{ (ok and not lost and true or false) | tojson }}
    - allow_test_mode_failure: true
    - comment: {{ (('not destroying ' ~ name ~ ': its QEMU runs (pid ' ~ (where.guests | join(', ')) ~ ') but its '
                    ~ 'directory is under none of the kvm paths ' ~ ((where.get('paths') or [kvm_path]) | join(', '))
                    ~ ' of this node: stop that QEMU, or declare the VM with its kvm_path, then destroy it again')
                   if lost else ('removing ' ~ dir) if ok else ('not destroying ' ~ name ~ ': its directory ' ~ d.dir
                   ~ ' is not <kvm_path>/vms/<vm> of kvm path ' ~ d.kvm_path)) | tojson }}

mccloud-kvm-vm-destroy-stop:
  mccloud_kvm.stopped:
    - failhard: true
    - name: {{ name | tojson }}
    - dir: {{ dir | tojson }}
    - timeout: {{ d.get('stop_timeout', 0) | int }}
    - require:
      - test: mccloud-kvm-vm-destroy-path

mccloud-kvm-vm-destroy:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        set -f
        case "$MCCLOUD_NAME" in ''|.|..|*/*) echo "bad VM name $MCCLOUD_NAME" >&2; exit 1 ;; esac
        [ "$MCCLOUD_DIR" = "$MCCLOUD_KVM_PATH/vms/$MCCLOUD_NAME" ] || { echo "$MCCLOUD_DIR is not the VM's directory" >&2; exit 1; }
        case "$MCCLOUD_TAP_PREFIX" in mck?*) ;; *) echo "bad tap prefix $MCCLOUD_TAP_PREFIX" >&2; exit 1 ;; esac
        done=
        for tap in $(ip -o link show | sed -n 's/^[0-9]*: \([^:@ ]*\).*/\1/p'); do
            case "$tap" in "$MCCLOUD_TAP_PREFIX"*) ip link del "$tap" && done="$done $tap" || exit $? ;; esac
        done
        if [ -d "$MCCLOUD_DIR" ] && [ ! -L "$MCCLOUD_DIR" ]; then
            rm -rf --one-file-system -- "$MCCLOUD_DIR" || exit $?
            done="$done $MCCLOUD_DIR"
        fi
        if [ -z "$done" ]; then echo "changed=no comment='no guest $MCCLOUD_NAME'"; exit 0; fi
        echo "changed=yes comment='guest $MCCLOUD_NAME destroyed:$done removed'"
    - env:
        MCCLOUD_NAME: {{ name | tojson }}
        MCCLOUD_KVM_PATH: {{ kvm_path | tojson }}
        MCCLOUD_DIR: {{ dir | tojson }}
        MCCLOUD_TAP_PREFIX: {{ d.tap_prefix | string | tojson }}
    - require:
      - mccloud_kvm: mccloud-kvm-vm-destroy-stop
