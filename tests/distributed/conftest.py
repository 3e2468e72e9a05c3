"""The ``ray`` marker (tests that start a local Ray cluster)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "ray: starts a local Ray cluster (needs the extra attnprobe[ray])")
