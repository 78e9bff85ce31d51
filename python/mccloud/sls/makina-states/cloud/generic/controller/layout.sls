{#- Historical name (makina-states): the controller's directories and ssh
    key pair, now makina-states.cloud.generic.controller (the registry
    directory and the key pair). Data: as generic.controller. #}
include:
  - makina-states.cloud.generic.controller
