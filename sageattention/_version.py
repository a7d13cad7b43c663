"""The base (public) version. A built wheel adds a local label (for example ``+sm75.torch2.12cu130``)
to its metadata at build time; see ``sageattention.build_info``."""

BASE_VERSION = "2.2.0"
