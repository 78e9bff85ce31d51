{#- Historical name (makina-states): the lxc driver's controller side, now
    makina-states.cloud.lxc.controller.post_deploy (marker grain and the
    nightly image-sync cron). Data: as post_deploy. #}
include:
  - makina-states.cloud.lxc.controller.post_deploy
