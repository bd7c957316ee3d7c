"""The ingress does no tensor math, so its processes do not load torch: importing service.app (what an Ingress
replica imports) in a fresh interpreter leaves torch out of sys.modules. The translator deployment is imported
only where the application is built."""

from __future__ import annotations

from tests.harness.processes import python_output


def test_the_ingress_imports_no_torch():
    script = (
        "import sys\n"
        "import service.app\n"
        "assert hasattr(service.app, 'Ingress') and hasattr(service.app, 'build_app')\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') or m == 'model.translator'))\n"
    )
    assert python_output(script) == "[]"


def test_building_the_application_still_binds_the_translators():
    script = (
        "import service.app\n"
        "app = service.app.build_app({'models': [{'id': 'en-zh', 'path': 'en-zh', 'source_lang': 'en',"
        " 'target_lang': 'zh'}]})\n"
        "print(type(app).__name__)\n"
    )
    assert python_output(script).endswith("Application")
