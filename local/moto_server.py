"""The moto server with local.moto_patches applied: `python -m local.moto_server -H 127.0.0.1 -p 5000`."""

from local.moto_patches import apply

if __name__ == "__main__":
    apply()
    from moto.server import main

    main()
