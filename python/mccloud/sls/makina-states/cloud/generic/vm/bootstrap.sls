{#- The guest's side of making it a minion, written from the compute node
    into its root filesystem before its minion first starts: the minion's
    configuration (minion.d/mccloud.conf: id, master, master_port), its
    pre-seeded key pair (accepted on the master beforehand), the master's
    public key, and the bootstrap script (the `script` setting). In
    mastersalt mode the configuration directory is /etc/mastersalt, and
    /etc/salt serves a masterless salt-call --local. The driver's
    bootstrap SLS then runs the script inside the guest.
    Data: pillar mccloud (rootfs, minion). #}
{%- from "makina-states/cloud/generic/job.jinja" import job, job_key with context %}
{%- set d = job %}
{%- set m = d.minion %}
{%- set conf = d.rootfs ~ m.conf_dir %}
include:
  - makina-states.cloud.generic.vm.rootfs_guard

mccloud-vm-minion-config:
  file.managed:
    - failhard: true
    - name: {{ (conf ~ '/minion.d/mccloud.conf') | tojson }}
    - contents_pillar: {{ job_key }}:minion:config
    - makedirs: true
    - mode: '0644'
    - follow_symlinks: false
    - require:
      - test: mccloud-vm-rootfs-guard

mccloud-vm-minion-pki:
  file.directory:
    - failhard: true
    - name: {{ (conf ~ '/pki/minion') | tojson }}
    - makedirs: true
    - mode: '0700'
    - require:
      - test: mccloud-vm-rootfs-guard

{%- for id, key, file, mode in [('pem', 'pem', 'minion.pem', '0400'), ('pub', 'pub', 'minion.pub', '0644'),
                                 ('master-pub', 'master_pub', 'minion_master.pub', '0644')] %}

mccloud-vm-minion-{{ id }}:
  file.managed:
    - failhard: true
    - name: {{ (conf ~ '/pki/minion/' ~ file) | tojson }}
    - contents_pillar: {{ job_key }}:minion:{{ key }}
    - mode: {{ mode | tojson }}
    - follow_symlinks: false
    - show_changes: false
    - require:
      - file: mccloud-vm-minion-pki
{%- endfor %}
{%- if m.mastersalt %}

mccloud-vm-minion-grains:
  file.serialize:
    - failhard: true
    - name: {{ (conf ~ '/grains') | tojson }}
    - serializer: yaml
    - merge_if_exists: true
    - dataset:
        makina-states.cloud.is.vm: true
    - require:
      - test: mccloud-vm-rootfs-guard

mccloud-vm-local-salt:
  file.managed:
    - failhard: true
    - name: {{ (d.rootfs ~ '/etc/salt/minion.d/mccloud-local.conf') | tojson }}
    - contents: |
        # Managed by mccloud: this host's own Salt runs masterless (salt-call --local).
        file_client: local
    - makedirs: true
    - follow_symlinks: false
    - require:
      - test: mccloud-vm-rootfs-guard
{%- endif %}

mccloud-vm-bootstrap-script:
  file.managed:
    - failhard: true
    - name: {{ (d.rootfs ~ '/usr/local/sbin/mccloud-bootstrap-salt') | tojson }}
    - contents_pillar: {{ job_key }}:minion:script
    - makedirs: true
    - mode: '0755'
    - follow_symlinks: false
    - require:
      - test: mccloud-vm-rootfs-guard
