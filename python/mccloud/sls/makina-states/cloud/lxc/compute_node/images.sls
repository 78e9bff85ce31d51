{#- Template containers (images) on the compute node. An image is built here
    from its lxc template when absent (the debian template debootstraps from
    Debian's mirror); otherwise it is synchronised from the controller by the
    sync_images runner. Data: pillar mccloud:images, mccloud:lxc_path. The
    command receives it through its environment only; state ids number the
    images in name order (an image name is data, never part of an id). #}
{%- set d = pillar['mccloud'] %}
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
    - contents: {{ (img | json | sha256)[:16] | tojson }}
    - replace: false
    - require:
      - cmd: mccloud-lxc-image-{{ i }}
{%- endfor %}
