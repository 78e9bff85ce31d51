{#- Start: the VM's seed written (NoCloud layout v1, docs/howto/kvm.md),
    then its guest started when it is not running. A guest running since
    before its seed ISO or argv were last written is restarted (ACPI
    powerdown, 60 s, then SIGTERM): that is how a new seed (a re-bootstrap,
    a changed network) reaches it; otherwise changes reach it at its next
    boot.

    The seed directory <dir>/seed (0700) holds meta-data, user-data,
    network-config (texts rendered by the driver, written from pillar with
    contents_pillar), mccloud/net.env, mccloud/password_hash (root's crypt
    hash, never the clear text), mccloud/version and mccloud/tree.tar (the
    staging tree seed-root the other steps wrote, owned by root in the
    archive). It is packed into <dir>/seed.iso (label cidata, mode 0600: it
    holds the minion's private key), made again only when its content
    changed. Job data start: false writes the seed without starting the
    guest (tests, an operator preparing a VM).

    The generic fix_dns, preprovision and registry SLS and the kvm
    preprovision write into seed-root: included here, the seed ISO
    requires each. When the job makes the VM a minion too (data `minion`), the generic
    bootstrap SLS place the minion's configuration and keys into seed-root
    before the seed is packed: the guest's minion starts on its first boot.
    Data: the job's (vm, target, dir, rootfs, seed, domain, controller_pubkey,
    vm_registry[, minion]). #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- from "makina-states/cloud/kvm/vm/qemu.jinja" import start_state with context %}
{%- set minions = [] %}
{%- for j in jobs if j.job.get('minion') %}{% do minions.append(j) %}{% endfor %}
{#- The SLS writing into seed-root: the seed is packed after each (explicit
    requisites, not only the order of the job's SLS); included, so that a
    start alone (vm_start) packs a complete seed too. #}
{%- set WRITERS = ['makina-states.cloud.generic.vm.fix_dns', 'makina-states.cloud.generic.vm.preprovision',
                   'makina-states.cloud.generic.vm.registry', 'makina-states.cloud.kvm.vm.preprovision'] %}
include:
{%- for w in WRITERS %}
  - {{ w }}
{%- endfor %}
{%- if minions %}
  - makina-states.cloud.generic.vm.bootstrap
{%- endif %}
{%- for j in jobs %}
{%- set d, key, s = j.job, j.key, j.sfx %}
{%- set v = d.vm %}
{%- set dom = d.get('domain') or {} %}
{%- set seed = d.dir ~ '/seed' %}

mccloud-kvm-vm-seed-dirs{{ s }}:
  file.directory:
    - failhard: true
    - names:
      - {{ seed | tojson }}
      - {{ (seed ~ '/mccloud') | tojson }}
    - mode: '0700'
{%- for id, file, src, secret in [('meta-data', 'meta-data', 'seed:meta_data', false),
                                   ('user-data', 'user-data', 'seed:user_data', true),
                                   ('network-config', 'network-config', 'seed:network_config', false),
                                   ('net-env', 'mccloud/net.env', 'seed:net_env', false),
                                   ('version', 'mccloud/version', 'seed:version', false),
                                   ('password-hash', 'mccloud/password_hash', 'vm:password_hash', true)] %}

mccloud-kvm-vm-seed-{{ id }}{{ s }}:
  file.managed:
    - failhard: true
    - name: {{ (seed ~ '/' ~ file) | tojson }}
    - contents_pillar: {{ key }}:{{ src }}
    - mode: '0600'
{%- if secret %}
    - show_changes: false
{%- endif %}
    - require:
      - file: mccloud-kvm-vm-seed-dirs{{ s }}
    - require_in:
      - cmd: mccloud-kvm-vm-seed-iso{{ s }}
{%- endfor %}

mccloud-kvm-vm-seed-iso{{ s }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        umask 077
        S="$MCCLOUD_DIR/seed"
        tar -C "$MCCLOUD_ROOTFS" --numeric-owner --owner=0 --group=0 --sort=name -cf "$S/mccloud/tree.tar.new" . || exit $?
        sum=$( (cd "$S" && cat meta-data user-data network-config mccloud/net.env mccloud/version \
            mccloud/password_hash mccloud/tree.tar.new) | sha256sum | cut -d' ' -f1)
        if [ -f "$MCCLOUD_DIR/seed.iso" ] && [ "$sum" = "$(cat "$MCCLOUD_DIR/seed.sum" 2>/dev/null)" ]; then
            rm -f "$S/mccloud/tree.tar.new"
            echo "changed=no comment='seed of $MCCLOUD_NAME unchanged'"; exit 0
        fi
        mv "$S/mccloud/tree.tar.new" "$S/mccloud/tree.tar" || exit 1
        err=$(genisoimage -quiet -V cidata -J -R -o "$MCCLOUD_DIR/seed.iso.new" "$S" 2>&1) || {
            rc=$?; echo "genisoimage failed (exit $rc): $err" >&2; exit "$rc"; }
        chmod 0600 "$MCCLOUD_DIR/seed.iso.new" && mv "$MCCLOUD_DIR/seed.iso.new" "$MCCLOUD_DIR/seed.iso" || exit 1
        printf '%s\n' "$sum" > "$MCCLOUD_DIR/seed.sum"
        echo "changed=yes comment='seed of $MCCLOUD_NAME written ($MCCLOUD_DIR/seed.iso)'"
    - env:
        MCCLOUD_NAME: {{ v.name | string | tojson }}
        MCCLOUD_DIR: {{ d.dir | string | tojson }}
        MCCLOUD_ROOTFS: {{ d.rootfs | string | tojson }}
    - require:
{%- for w in WRITERS %}
      - sls: {{ w }}
{%- endfor %}
{%- if d.get('minion') %}
      - sls: makina-states.cloud.generic.vm.bootstrap
{%- endif %}

mccloud-kvm-vm-restart{{ s }}:
  mccloud_kvm.stopped:
    - failhard: true
    - name: {{ v.name | string | tojson }}
    - dir: {{ d.dir | string | tojson }}
    - timeout: 60
    - stale_only: true
    - require:
      - cmd: mccloud-kvm-vm-seed-iso{{ s }}
{%- if d.get('start', true) %}
{{ start_state('mccloud-kvm-vm-start', d, s, requires=[{'mccloud_kvm': 'mccloud-kvm-vm-restart' ~ s}]) }}
{%- else %}

mccloud-kvm-vm-start{{ s }}:
  test.configurable_test_state:
    - name: {{ v.name | string | tojson }}
    - changes: false
    - result: true
    - comment: {{ ('not starting ' ~ v.name ~ ' (job data start: false)') | tojson }}
{%- endif %}
{%- endfor %}
