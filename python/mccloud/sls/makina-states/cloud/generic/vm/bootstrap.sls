{#- The guest's side of making it a minion, written from the compute node
    into its root filesystem before its minion first starts: the minion's
    configuration (minion.d/mccloud.conf: id, master, master_port), its
    pre-seeded key pair (accepted on the master beforehand), the master's
    public key, and the bootstrap script (the `script` setting). In
    mastersalt mode the configuration directory is /etc/mastersalt, and
    /etc/salt serves a masterless salt-call --local. The driver's
    bootstrap SLS then runs the script inside the guest.
    Every write goes through mccloud_rootfs, which never follows a link
    the VM planted. Data: the job's (rootfs, minion). #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- for j in jobs %}
{%- set d, job_key, s = j.job, j.key, j.sfx %}
{%- set m = d.minion %}
{%- set root = d.rootfs | string %}
{%- set conf = m.conf_dir | string %}

mccloud-vm-minion-config{{ s }}:
  mccloud_rootfs.managed:
    - failhard: true
    - name: {{ (conf ~ '/minion.d/mccloud.conf') | tojson }}
    - root: {{ root | tojson }}
    - contents_pillar: {{ job_key }}:minion:config
    - mode: '0644'

mccloud-vm-minion-pki{{ s }}:
  mccloud_rootfs.directory:
    - failhard: true
    - name: {{ (conf ~ '/pki/minion') | tojson }}
    - root: {{ root | tojson }}
    - mode: '0700'

{%- for id, key, file, mode in [('pem', 'pem', 'minion.pem', '0400'), ('pub', 'pub', 'minion.pub', '0644'),
                                 ('master-pub', 'master_pub', 'minion_master.pub', '0644')] %}

mccloud-vm-minion-{{ id }}{{ s }}:
  mccloud_rootfs.managed:
    - failhard: true
    - name: {{ (conf ~ '/pki/minion/' ~ file) | tojson }}
    - root: {{ root | tojson }}
    - contents_pillar: {{ job_key }}:minion:{{ key }}
    - mode: {{ mode | tojson }}
    - show_changes: false
    - require:
      - mccloud_rootfs: mccloud-vm-minion-pki{{ s }}
{%- endfor %}
{%- if m.mastersalt %}

mccloud-vm-minion-grains{{ s }}:
  mccloud_rootfs.merged:
    - failhard: true
    - name: {{ (conf ~ '/grains') | tojson }}
    - root: {{ root | tojson }}
    - dataset:
        makina-states.cloud.is.vm: true

mccloud-vm-local-salt{{ s }}:
  mccloud_rootfs.managed:
    - failhard: true
    - name: /etc/salt/minion.d/mccloud-local.conf
    - root: {{ root | tojson }}
    - contents: |
        # Managed by mccloud: this host's own Salt runs masterless (salt-call --local).
        file_client: local
{%- endif %}

mccloud-vm-bootstrap-script{{ s }}:
  mccloud_rootfs.managed:
    - failhard: true
    - name: /usr/local/sbin/mccloud-bootstrap-salt
    - root: {{ root | tojson }}
    - contents_pillar: {{ job_key }}:minion:script
    - mode: '0755'
{%- endfor %}
