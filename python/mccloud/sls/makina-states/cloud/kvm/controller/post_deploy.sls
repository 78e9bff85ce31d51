{#- Controller side of the kvm driver: the driver marker and the nightly
    kvm image synchronisation (a root cron entry running
    mc_cloud_kvm.sync_images on every kvm compute node, on the lxc images'
    schedule: cron_sync, cron_minute, cron_hour of
    mc_cloud_images.settings()['lxc']). The command is fixed text; the
    schedule is written only when both values are plain cron fields.
    Data: pillar mccloud:image_sync (cron_sync, cron_minute, cron_hour,
    mastersalt). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set s = job.image_sync %}
{%- set command = 'salt-run -c ' ~ ('/etc/mastersalt' if s.mastersalt else '/etc/salt')
                  ~ ' -l warning mc_cloud_kvm.sync_images >/dev/null' %}
{%- set identifier = 'mccloud kvm image synchroniser' %}
mccloud-kvm-controller-grain:
  grains.present:
    - name: makina-states.cloud.kvm.controller
    - value: true
{%- if s.cron_sync %}
{%- set minute, hour = s.cron_minute | string, s.cron_hour | string %}
{%- set field = '([0-9*/,-]{1,64})\\Z' %}
{%- set plain = (minute | regex_match(field)) and (hour | regex_match(field)) and true or false %}

mccloud-kvm-image-sync-schedule:
  test.configurable_test_state:
    - failhard: true
    - name: the image sync schedule is made of cron fields
    - changes: false
    - result: {{ plain }}
    - allow_test_mode_failure: true
    - comment: {{ (('minute ' ~ minute ~ ', hour ' ~ hour) if plain else
                   ('not installing the kvm image sync cron entry: cron_minute (' ~ minute ~ ') and cron_hour ('
                    ~ hour ~ ') of makina-states.cloud.images.lxc must be cron fields (digits, *, /, - and ,)'))
                  | tojson }}

mccloud-kvm-image-sync-cron-pkg:
  pkg.installed:
    - failhard: true
    - name: cron

mccloud-kvm-image-sync-cron:
  cron.present:
    - failhard: true
    - name: {{ command | tojson }}
    - identifier: {{ identifier | tojson }}
    - user: root
    - minute: {{ (minute if plain else '0') | tojson }}
    - hour: {{ (hour if plain else '0') | tojson }}
    - require:
      - test: mccloud-kvm-image-sync-schedule
      - pkg: mccloud-kvm-image-sync-cron-pkg
{%- elif salt['cmd.which']('crontab') %}

mccloud-kvm-image-sync-cron:
  cron.absent:
    - failhard: true
    - name: {{ command | tojson }}
    - identifier: {{ identifier | tojson }}
    - user: root
{%- endif %}
