{#- kvm images, built on the controller when their version directory
    <images_root>/<image>/<version> is absent, by the image builder
    (mccloud/data/kvm-image-build.sh SRC_TREE_OR_EMPTY OUT_DIR: the recipe
    in its environment, MCCLOUD_RELEASE, MCCLOUD_PACKAGES one per line,
    MCCLOUD_CLOUD_INIT, MCCLOUD_DISK_SIZE, MCCLOUD_SEED_SCRIPT; success is
    exit 0 and a last line "mccloud-kvm-image: built <version>"), into
    <version>.build, renamed once complete (disk.qcow2, vmlinuz,
    initrd.img). An image made `from` an lxc image starts from that
    image's root filesystem (from_tree, built before by the lxc images
    SLS), which must carry Salt: kvm guests get no Salt copied in at
    bootstrap. Synchronised to the nodes by mc_cloud_kvm.sync_images. State
    ids number the images in name order. Data: pillar mccloud (images_root,
    images, builder, seed_script). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
{%- if not d.images %}
mccloud-kvm-no-images:
  test.nop:
    - name: no kvm image declared
{%- endif %}
{%- for name, img in d.images | dictsort %}
{%- set i = loop.index0 %}

mccloud-kvm-image-{{ i }}:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        out="$MCCLOUD_IMAGES_ROOT/$MCCLOUD_NAME/$MCCLOUD_VERSION"
        if [ -f "$out/mccloud-image-version" ]; then
            echo "changed=no comment='image $MCCLOUD_NAME $MCCLOUD_VERSION exists'"; exit 0
        fi
        if [ -n "$MCCLOUD_FROM_TREE" ] && [ ! -x "$MCCLOUD_FROM_TREE$MCCLOUD_PREFIX/bin/salt-minion" ]; then
            echo "kvm image $MCCLOUD_NAME: its lxc image's tree $MCCLOUD_FROM_TREE has no Salt" \
                "($MCCLOUD_PREFIX/bin/salt-minion): build the controller's wheelhouse (mc_cloud_controller.wheelhouse)," \
                "remove the lxc image, then configure the images again" >&2
            exit 1
        fi
        [ -f "$MCCLOUD_BUILDER" ] || { echo "the image builder $MCCLOUD_BUILDER is missing" >&2; exit 1; }
        # $work is the builder's OUT_DIR (it must not exist); the builder
        # works in $work.tmp, with the host's /dev, /proc, /sys mounted
        # into it while it runs: that one is the builder's alone (it cleans
        # a leftover under its lock, unmounting first).
        work="$out.build"
        parent=$(dirname "$out")
        mkdir -p "$parent" || exit 1
        if [ -e "$work" ] || [ -L "$work" ]; then
            exec 9<"$parent"
            flock -n 9 || { echo "kvm image $MCCLOUD_NAME: a build is running in $parent: try again once it ends" >&2; exit 1; }
            canon=$(realpath -m -- "$work") || exit 1
            if awk -v p="$canon/" '{ m = $2; gsub(/\\040/, " ", m); gsub(/\\011/, "\t", m); gsub(/\\012/, "\n", m);
                                     gsub(/\\134/, "\\", m); if (index(m "/", p) == 1) found = 1 }
                                   END { exit !found }' /proc/mounts; then
                echo "kvm image $MCCLOUD_NAME: something is mounted under the stale $work: unmount it" \
                    "(findmnt -R $canon), then configure the images again" >&2
                exit 1
            fi
            rm -rf --one-file-system -- "$work" || { echo "cannot remove the stale $work" >&2; exit 1; }
            exec 9<&-
        fi
        log="$work.log"
        sh "$MCCLOUD_BUILDER" "$MCCLOUD_FROM_TREE" "$work" >"$log" 2>&1
        rc=$?
        last=$(tail -n 1 "$log")
        case "$rc:$last" in
            "0:mccloud-kvm-image: built "*) ;;
            *) echo "building kvm image $MCCLOUD_NAME failed (exit $rc, log $log): $(tail -n 5 "$log")" >&2; exit 1 ;;
        esac
        for f in disk.qcow2 vmlinuz initrd.img; do
            [ -s "$work/$f" ] || { echo "kvm image $MCCLOUD_NAME: the builder made no $f (log $log)" >&2; exit 1; }
        done
        [ -s "$work/mccloud-image-version" ] || printf '%s\n' "$MCCLOUD_VERSION" > "$work/mccloud-image-version"
        mv -T "$work" "$out" || exit 1
        echo "changed=yes comment='image $MCCLOUD_NAME $MCCLOUD_VERSION built (${last#mccloud-kvm-image: })'"
    - env:
        MCCLOUD_IMAGES_ROOT: {{ d.images_root | string | tojson }}
        MCCLOUD_NAME: {{ name | string | tojson }}
        MCCLOUD_VERSION: {{ (img.get('version') or 'unversioned') | string | tojson }}
        MCCLOUD_FROM_TREE: {{ (img.get('from_tree') or '') | string | tojson }}
        MCCLOUD_PREFIX: /opt/mccloud/salt
        MCCLOUD_BUILDER: {{ d.builder | string | tojson }}
        MCCLOUD_RELEASE: {{ (img.get('release') or 'bookworm') | string | tojson }}
        MCCLOUD_PACKAGES: {{ (img.get('packages') or ['linux-image-cloud-amd64']) | map('string') | join('\n') | tojson }}
        MCCLOUD_CLOUD_INIT: {{ ('true' if img.get('cloud_init') else 'false') | tojson }}
        MCCLOUD_DISK_SIZE: {{ (img.get('disk_size') or '') | string | tojson }}
        MCCLOUD_SEED_SCRIPT: {{ d.seed_script | string | tojson }}
{%- endfor %}
