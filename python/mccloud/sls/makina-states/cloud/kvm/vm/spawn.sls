{#- Spawn: the VM's directory on its node (<kvm_path>/vms/<vm>, 0700), its
    disk (a qcow2 overlay of its image's versioned base, at the VM's size
    disk_mib, never below the base's) with, when the core boots the VM's
    own kernel copies (domain kernel/initrd in its directory), those
    copies taken from the image once, when the disk is made (from the
    image of its backing file for a VM made before it had them): a new
    image version never changes the kernel of an existing VM;
    the staging tree of its seed (seed-root, 0700: the generic VM SLS write
    the guest's files there), a tap per NIC on the node's bridge, and its
    domain files: domain.json (the core's rendering) and qemu.argv (the
    argv, NUL-separated: what the node's boot service starts). The guest
    is NOT started: its first boot is at initial_setup, once its seed is
    complete. Running it again changes nothing. Commands receive the data
    through their environment only (the argv as MCCLOUD_ARG_<n>).
    Data: the job's (vm, dir, kvm_path, rootfs, domain, bridge); domain.image_dir
    (else the directory of domain.base) names the image version. #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- from "makina-states/cloud/kvm/vm/qemu.jinja" import argv_env, REBUILD_ARGV with context %}
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}
{%- set v = d.vm %}
{%- set dom = d.get('domain') or {} %}
{%- set name = v.name | string %}
{%- set base = (dom.get('base') or '') | string %}
{#- paths compared without trailing slashes (the core trims kvm_path's) #}
{%- set kvm_path = (d.kvm_path | string).rstrip('/') %}
{%- set vm_dir = (d.dir | string).rstrip('/') %}
{%- set ok_dir = dom and kvm_path.startswith('/') and vm_dir == kvm_path ~ '/vms/' ~ name
                 and (dom.dir | string).rstrip('/') == vm_dir and '/' not in name and name not in ['', '.', '..'] %}

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
        umask 077
        vsize() {  # the virtual size in bytes of disk image $1
            qemu-img info --output=json --force-share "$1" | sed -n 's/^ *"virtual-size": *\([0-9]*\).*/\1/p' | head -n 1
        }
        copy() {  # copy SRC DEST: mode 0600, atomically (DEST.new, then renamed)
            [ -f "$1" ] || { echo "kvm VM $MCCLOUD_NAME: its image has no $1: run mc_cloud_kvm.sync_images" >&2; return 1; }
            rm -f -- "$2.new" && cp -- "$1" "$2.new" && chmod 0600 "$2.new" && mv -f -- "$2.new" "$2"
        }
        # The VM boots its own copies of its image's kernel and initrd
        # (domain kernel and initrd in its directory), taken when its disk
        # is made: a VM keeps the kernel of its base for its life, a new
        # image version changes nothing for it. A core booting the image's
        # own files needs no copies.
        own() { case "$1" in "$MCCLOUD_DIR"/*) return 0 ;; *) return 1 ;; esac; }
        kernels() {  # kernels IMAGE_DIR: the copies the VM lacks (all with "all")
            for pair in "vmlinuz:$MCCLOUD_KERNEL" "initrd.img:$MCCLOUD_INITRD"; do
                src=$1/${pair%%:*}; dest=${pair#*:}
                own "$dest" || continue
                [ "$2" = all ] || [ ! -e "$dest" ] || continue
                copy "$src" "$dest" || return 1
                copied="$copied ${dest##*/}"
            done
        }
        copied=
        if [ -e "$MCCLOUD_DISK" ]; then
            if { own "$MCCLOUD_KERNEL" && [ ! -e "$MCCLOUD_KERNEL" ]; } || { own "$MCCLOUD_INITRD" && [ ! -e "$MCCLOUD_INITRD" ]; }; then
                # a VM made before it had copies: its disk's base says its image
                backing=$(qemu-img info --output=json --force-share "$MCCLOUD_DISK" |
                    sed -n 's/^ *"backing-filename": *"\(.*\)",\{0,1\}$/\1/p' | head -n 1)
                case "$backing" in
                    '') echo "kvm VM $MCCLOUD_NAME: its disk $MCCLOUD_DISK has no backing file: its kernel is unknown" >&2; exit 1 ;;
                    *\\*) echo "kvm VM $MCCLOUD_NAME: cannot read the backing file of $MCCLOUD_DISK" >&2; exit 1 ;;
                    /*) ;;
                    *) backing=$(dirname "$MCCLOUD_DISK")/$backing ;;
                esac
                kernels "$(dirname "$backing")" || exit 1
                echo "changed=yes comment='disk $MCCLOUD_DISK exists; kernel copied from its base $backing:$copied'"; exit 0
            fi
            echo "changed=no comment='disk $MCCLOUD_DISK exists'"; exit 0
        fi
        if [ ! -f "$MCCLOUD_BASE" ]; then
            echo "the image of $MCCLOUD_NAME is not on this node ($MCCLOUD_BASE): run mc_cloud_kvm.sync_images" >&2
            exit 1
        fi
        case "$MCCLOUD_DISK_MIB" in
            ''|0|*[!0-9]*) echo "kvm VM $MCCLOUD_NAME: its settings have no disk size (disk_mib): this mccloud core" \
                                "does not render kvm VMs; upgrade it, then provision again" >&2; exit 1 ;;
        esac
        want=$((MCCLOUD_DISK_MIB * 1048576))
        base_size=$(vsize "$MCCLOUD_BASE")
        [ -n "$base_size" ] || { echo "cannot read the size of $MCCLOUD_BASE" >&2; exit 1; }
        if [ "$want" -lt "$base_size" ]; then
            echo "kvm VM $MCCLOUD_NAME: its size ($MCCLOUD_DISK_MIB MiB) is below its image's ($((base_size / 1048576)) MiB," \
                 "$MCCLOUD_BASE): set its size to at least that" >&2
            exit 1
        fi
        kernels "$MCCLOUD_IMAGE_DIR" all || exit 1
        qemu-img create -q -f qcow2 -F qcow2 -b "$MCCLOUD_BASE" "$MCCLOUD_DISK.new" "${MCCLOUD_DISK_MIB}M" || exit $?
        mv "$MCCLOUD_DISK.new" "$MCCLOUD_DISK" || exit $?
        echo "changed=yes comment='disk $MCCLOUD_DISK made (${MCCLOUD_DISK_MIB} MiB over $MCCLOUD_BASE)${copied:+, kernel copied:$copied}'"
    - env:
        MCCLOUD_NAME: {{ name | tojson }}
        MCCLOUD_DIR: {{ d.dir | string | tojson }}
        MCCLOUD_DISK: {{ (dom.get('disk') or '') | string | tojson }}
        MCCLOUD_BASE: {{ base | tojson }}
        MCCLOUD_IMAGE_DIR: {{ (dom.get('image_dir') or base.rsplit('/', 1)[0]) | string | tojson }}
        MCCLOUD_KERNEL: {{ (dom.get('kernel') or '') | string | tojson }}
        MCCLOUD_INITRD: {{ (dom.get('initrd') or '') | string | tojson }}
        MCCLOUD_DISK_MIB: {{ (v.get('disk_mib') or 0) | int | string | tojson }}
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
