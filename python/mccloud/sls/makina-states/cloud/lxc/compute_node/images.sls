{#- Template containers (images) on the compute node. An image is built here
    from its lxc template when absent (the debian template debootstraps from
    Debian's mirror); otherwise it is synchronised from the controller by the
    sync_images runner. Data: pillar mccloud:images, mccloud:lxc_path,
    mccloud:wheelhouse, mccloud:bootstrap_script. The command receives it
    through its environment only; state ids number the images in name order
    (an image name is data, never part of an id).

    Salt goes into each image that has python3 (image setting salt, default
    true) from the controller's wheelhouse, with the bootstrap script's
    --install-only run in a chroot, which also installs the minions' units,
    enabled, each starting once its key is in place: VMs cloned from it
    start their minion as they boot. #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
{%- set needs = {'debian': ['debootstrap'], 'busybox': ['busybox-static'], 'sshd': ['openssh-server']} %}
{%- for name, img in d.images | dictsort %}
{%- set i = loop.index0 %}
{%- set template = img.get('template') or 'debian' %}
{%- set targs = img.get('template_args') or '' %}
{%- set targs = targs.split() if targs is string else targs | map('string') | list %}
mccloud-lxc-image-deps-{{ i }}:
  pkg.installed:
    - pkgs: {{ (['lxc'] + needs.get(template, [])) | tojson }}

mccloud-lxc-image-{{ i }}:
  cmd.run:
    - stateful: true
    - name: |
        if [ -e "$MCCLOUD_LXC_PATH/$MCCLOUD_NAME/config" ]; then
            echo "changed=no comment='image $MCCLOUD_NAME exists'"; exit 0
        fi
        set -f
        IFS='
        '
        if [ "$MCCLOUD_TEMPLATE" = debian ]; then
            set -- -r "$MCCLOUD_RELEASE"
            if [ -n "$MCCLOUD_PACKAGES" ]; then set -- "$@" "--packages=$MCCLOUD_PACKAGES"; fi
        else
            # one template argument per line
            set -- $MCCLOUD_TEMPLATE_ARGS
        fi
        if [ "$#" -gt 0 ]; then set -- -- "$@"; fi
        lxc-create -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" -t "$MCCLOUD_TEMPLATE" "$@" || exit $?
        echo "changed=yes comment='image $MCCLOUD_NAME created from template $MCCLOUD_TEMPLATE'"
    - env:
        MCCLOUD_LXC_PATH: {{ d.lxc_path | string | tojson }}
        MCCLOUD_NAME: {{ name | string | tojson }}
        MCCLOUD_TEMPLATE: {{ template | string | tojson }}
        MCCLOUD_RELEASE: {{ (img.get('release') or 'bookworm') | string | tojson }}
        MCCLOUD_PACKAGES: {{ (img.get('packages') or []) | map('string') | join(',') | tojson }}
        MCCLOUD_TEMPLATE_ARGS: {{ targs | join('\n') | tojson }}
    - require:
      - pkg: mccloud-lxc-image-deps-{{ i }}

mccloud-lxc-image-version-{{ i }}:
  file.managed:
    - name: {{ (d.lxc_path ~ '/' ~ name ~ '/mccloud-image-version') | tojson }}
    - contents: {{ (img.get('version') or (img | json | sha256)[:16]) | string | tojson }}
    - replace: false
    - require:
      - cmd: mccloud-lxc-image-{{ i }}

{%- if img.get('salt', true) and d.get('wheelhouse') %}

mccloud-lxc-image-salt-{{ i }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        R="$MCCLOUD_LXC_PATH/$MCCLOUD_NAME/rootfs"
        if [ -x "$R$MCCLOUD_PREFIX/bin/salt-minion" ]; then
            echo "changed=no comment='Salt is in image $MCCLOUD_NAME'"; exit 0
        fi
        if [ ! -x "$R/usr/bin/python3" ]; then
            echo "changed=no comment='image $MCCLOUD_NAME has no python3: Salt is not preinstalled'"; exit 0
        fi
        if [ ! -f "$MCCLOUD_WHEELHOUSE/SALT_VERSION" ]; then
            echo "changed=no comment='no wheelhouse at $MCCLOUD_WHEELHOUSE: Salt is not preinstalled'"; exit 0
        fi
        set -e
        mkdir -p "$R/var/cache/mccloud/wheelhouse" "$R/usr/local/sbin"
        cp -a "$MCCLOUD_WHEELHOUSE/." "$R/var/cache/mccloud/wheelhouse/"
        printf '%s' "$MCCLOUD_SCRIPT" > "$R/usr/local/sbin/mccloud-bootstrap-salt"
        chmod 755 "$R/usr/local/sbin/mccloud-bootstrap-salt"
        cleanup() {
            umount "$R/proc" 2>/dev/null || true
            umount "$R/dev" 2>/dev/null || true
            rm -rf "$R/var/cache/mccloud/wheelhouse"
        }
        trap cleanup EXIT
        mount --bind /dev "$R/dev"
        mount -t proc proc "$R/proc"
        err=$(mktemp)
        set +e
        chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
            /bin/sh /usr/local/sbin/mccloud-bootstrap-salt --install-only 2>"$err" >&2
        rc=$?
        set -e
        cat "$err" >&2
        why=$(tail -n 1 "$err" | tr -d "'"); rm -f "$err"
        case "$rc" in
            0) echo "changed=yes comment='Salt installed in image $MCCLOUD_NAME'" ;;
            3) # Salt cannot be installed in this image (no python3-venv ...): its VMs
               # get it at bootstrap, or fail there with the same reason.
               echo "changed=no comment='Salt not preinstalled in image $MCCLOUD_NAME: $why'" ;;
            *) echo "changed=no comment='installing Salt in image $MCCLOUD_NAME failed (exit $rc): $why'"; exit "$rc" ;;
        esac
    - env:
        MCCLOUD_LXC_PATH: {{ d.lxc_path | string | tojson }}
        MCCLOUD_NAME: {{ name | string | tojson }}
        MCCLOUD_PREFIX: /opt/mccloud/salt
        MCCLOUD_WHEELHOUSE: {{ d.wheelhouse | string | tojson }}
        MCCLOUD_SCRIPT: {{ d.bootstrap_script | string | tojson }}
    - require:
      - cmd: mccloud-lxc-image-{{ i }}
    - require_in:
      - file: mccloud-lxc-image-version-{{ i }}
{%- endif %}
{%- endfor %}
