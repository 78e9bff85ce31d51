{#- Spawn: clone the template container or create it from the image
    (*-scratch types), configure it from the registry and start it. Running
    it again on an existing container changes nothing. Commands receive the
    data through their environment only.

    Clones are copy-on-write where the storage allows it. How to clone
    from each storage the template may be on is the lxc driver's decision
    (data `clone`: mccloud.drivers.lxc.clone_plan, one list of lxc-copy
    arguments per storage); the node only reads which storage that is,
    from the template's own lxc.rootfs.path.

    When the job makes the VM a minion too (data `minion`: provisioning
    with the bootstrap step), its configuration and keys are placed in the
    root filesystem before the first start, so that an image carrying
    Salt's unit starts the minion at boot. #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- set minions = [] %}
{%- for j in jobs if j.job.get('minion') %}{% do minions.append(j) %}{% endfor %}
include:
  - makina-states.cloud.lxc.vm.config
  - makina-states.cloud.lxc.vm.volumes
{%- if minions %}
  - makina-states.cloud.generic.vm.bootstrap
{%- endif %}
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}
{%- set v = d.vm %}
{%- set P = d.lxc_path %}
{%- set img = d.images.get(v.image, {'template': v.image}) if v.image is string else {} %}
{%- set template = img.get('template') or 'debian' %}
{%- set m = d.get('minion') %}
{%- if v.get('idmap_base') %}

{#- An unprivileged container's root (the first host id of its block) must
    traverse the directories down to its own, or lxc-start aborts: say
    which one, before anything is created. #}
mccloud-lxc-vm-traverse{{ s }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        set -f
        as_root() { setpriv --reuid "$MCCLOUD_ROOT" --regid "$MCCLOUD_ROOT" --clear-groups -- "$@"; }
        if as_root test -x "$MCCLOUD_LXC_PATH/"; then
            echo "changed=no comment='the root of $MCCLOUD_NAME (host uid $MCCLOUD_ROOT) reaches $MCCLOUD_LXC_PATH'"
            exit 0
        fi
        d=/
        for part in $(printf '%s' "$MCCLOUD_LXC_PATH" | tr '/' ' '); do
            d="${d%/}/$part"
            as_root test -x "$d/" || break
        done
        echo "$MCCLOUD_NAME runs unprivileged: its root (host uid $MCCLOUD_ROOT) cannot traverse $d" \
            "($(stat -c '%A %U' "$d")), on the way to the lxc path $MCCLOUD_LXC_PATH. Let it through" \
            "(chmod o+x $d, or an ACL), or set privileged: true for the VM" >&2
        exit 1
    - env:
        MCCLOUD_LXC_PATH: {{ P | string | tojson }}
        MCCLOUD_NAME: {{ v.name | string | tojson }}
        MCCLOUD_ROOT: {{ v.idmap_base | int | string | tojson }}
    - require_in:
      - cmd: mccloud-lxc-vm-create{{ s }}
{%- endif %}

mccloud-lxc-vm-create{{ s }}:
  cmd.run:
    - failhard: true
    - stateful: true
{%- if v.get('from_container') %}
    - name: |
        if [ -e "$MCCLOUD_LXC_PATH/$MCCLOUD_NAME/config" ]; then
            echo "changed=no comment='container $MCCLOUD_NAME exists'"; exit 0
        fi
        src=$(sed -n 's/^[[:space:]]*lxc\.rootfs\.path[[:space:]]*=[[:space:]]*//p' \
            "$MCCLOUD_LXC_PATH/$MCCLOUD_FROM/config" 2>/dev/null | tail -n 1)
        from=dir
        case "$src" in
            btrfs:*)
                # lxc labels a plain directory btrfs when it was copied onto
                # btrfs across lxc paths: only a subvolume can be snapshotted.
                if btrfs subvolume show "${src#btrfs:}" >/dev/null 2>&1; then from=btrfs; fi ;;
            zfs:*) from=zfs ;;
            lvm:*)
                from=lvm
                if lvs --noheadings -o lv_attr "${src#lvm:}" 2>/dev/null | grep -q '^[[:space:]]*V'; then
                    from=lvm_thin
                fi ;;
        esac
        if [ -n "$MCCLOUD_BTRFS_PATH" ] && [ "$(stat -f -c %T "$MCCLOUD_LXC_PATH")" != btrfs ]; then
            echo "backing btrfs: the lxc path $MCCLOUD_LXC_PATH is not on a btrfs file system;" \
                "mount one there or choose another backing" >&2
            exit 1
        fi
        # the driver's arguments for that storage: MCCLOUD_CLONE_<storage>_<n>
        set --
        i=0
        while arg=$(printenv "MCCLOUD_CLONE_${from}_$i"); do
            set -- "$@" "$arg"
            i=$((i + 1))
        done
        lxc-copy -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_FROM" -N "$MCCLOUD_NAME" "$@" || exit $?
        echo "changed=yes comment='container $MCCLOUD_NAME cloned from $MCCLOUD_FROM'"
{%- else %}
    - name: |
        if [ -e "$MCCLOUD_LXC_PATH/$MCCLOUD_NAME/config" ]; then
            echo "changed=no comment='container $MCCLOUD_NAME exists'"; exit 0
        fi
        set -- -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" -t "$MCCLOUD_TEMPLATE"
        if [ "$MCCLOUD_BACKING" = lvm ]; then
            set -- "$@" -B lvm --vgname "$MCCLOUD_VGNAME" --fssize "$MCCLOUD_SIZE"
            if [ -n "$MCCLOUD_LVNAME" ]; then set -- "$@" --lvname "$MCCLOUD_LVNAME"; fi
        fi
        if [ "$MCCLOUD_TEMPLATE" = debian ]; then
            set -- "$@" -- -r "$MCCLOUD_RELEASE"
            if [ -n "$MCCLOUD_PACKAGES" ]; then set -- "$@" "--packages=$MCCLOUD_PACKAGES"; fi
        fi
        lxc-create "$@" || exit $?
        echo "changed=yes comment='container $MCCLOUD_NAME created from template $MCCLOUD_TEMPLATE'"
{%- endif %}
    - env:
        MCCLOUD_LXC_PATH: {{ P | string | tojson }}
        MCCLOUD_NAME: {{ v.name | string | tojson }}
{%- if v.get('from_container') %}
        MCCLOUD_FROM: {{ v.from_container | string | tojson }}
        MCCLOUD_BTRFS_PATH: {{ ('1' if d.clone.btrfs_path else '') | tojson }}
{%- for source in ['dir', 'btrfs', 'zfs', 'lvm', 'lvm-thin'] %}
{%- for arg in d.clone.args[source] %}
        MCCLOUD_CLONE_{{ source | replace('-', '_') }}_{{ loop.index0 }}: {{ arg | string | tojson }}
{%- endfor %}
{%- endfor %}
{%- else %}
        MCCLOUD_BACKING: {{ (v.get('backing') or '') | string | tojson }}
        MCCLOUD_SIZE: {{ (v.get('size') or '') | string | tojson }}
        MCCLOUD_VGNAME: {{ (v.get('vgname') or '') | string | tojson }}
        MCCLOUD_LVNAME: {{ (v.get('lvname') or '') | string | tojson }}
        MCCLOUD_TEMPLATE: {{ template | string | tojson }}
        MCCLOUD_RELEASE: {{ (img.get('release') or 'bookworm') | string | tojson }}
        MCCLOUD_PACKAGES: {{ (img.get('packages') or []) | map('string') | join(',') | tojson }}
{%- endif %}
    - require_in:
      - file: mccloud-lxc-vm-config{{ s }}
      - mccloud_rootfs: mccloud-lxc-vm-guest-network{{ s }}
{%- if m %}
{%- for id in ['minion-config', 'minion-pki', 'minion-pem', 'minion-pub', 'minion-master-pub', 'bootstrap-script']
              + (['minion-grains', 'local-salt'] if m.mastersalt else []) %}
      - mccloud_rootfs: mccloud-vm-{{ id }}{{ s }}
{%- endfor %}
{%- endif %}

mccloud-lxc-vm-start{{ s }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        if lxc-info -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" -s | grep -q RUNNING; then
            echo "changed=no comment='container $MCCLOUD_NAME is running'"; exit 0
        fi
        log="$MCCLOUD_LXC_PATH/$MCCLOUD_NAME/lxc-start.log"
        lxc-start -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" -l ERROR -o "$log" || {
            rc=$?
            echo "lxc-start $MCCLOUD_NAME failed; its log ($log) says:" >&2
            grep -v -e 'lxc_start.c:main' -e wait_on_daemonized_start -e '__lxc_start' "$log" | tail -n 3 >&2
            exit "$rc"
        }
        lxc-wait -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" -s RUNNING -t 60 || exit $?
        echo "changed=yes comment='container $MCCLOUD_NAME started'"
    - env:
        MCCLOUD_LXC_PATH: {{ P | string | tojson }}
        MCCLOUD_NAME: {{ v.name | string | tojson }}
    - require:
      - file: mccloud-lxc-vm-config{{ s }}
      - file: mccloud-lxc-vm-config-include{{ s }}
      - mccloud_rootfs: mccloud-lxc-vm-guest-network{{ s }}
      - sls: makina-states.cloud.lxc.vm.volumes
{%- if m %}
      - sls: makina-states.cloud.generic.vm.bootstrap
{%- endif %}
{%- endfor %}
