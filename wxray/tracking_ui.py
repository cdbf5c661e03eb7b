"""The MLflow UI as wxray serves it (`mlflow ui --app-name wxray`): MLflow's own app, in model-training mode.

MLflow 3.17's UI shows its GenAI or its model-training views by a toggle it keeps in the browser's localStorage
(key `mlflow.workflowType_v1`, a JSON string), GenAI while the key is absent; the experiment's tags do not
enter into it. So a first-time visitor of the bare address lands on the GenAI overview (traces, latency, a
"Detect Issues" pop-up), whatever wxray tags. This app is MLflow's app with one change to the one page it
serves for every UI route (`index.html`, the UI routes by the URL's fragment): a script that sets the toggle to
model training when the visitor has not chosen yet. A visitor who switched keeps their choice; the API, the
static files and everything else are MLflow's, untouched. Registered as the `mlflow.app` entry point `wxray`
(pyproject.toml), which is how MLflow's own `basic-auth` app plugs in.
"""

from __future__ import annotations

import json

from flask import Response, request
from mlflow.server import app as flask_app
from mlflow.server.fastapi_app import app

WORKFLOW_KEY = "mlflow.workflowType_v1"
MODEL_TRAINING = "machine_learning"
_KEY, _VALUE = json.dumps(WORKFLOW_KEY), json.dumps(json.dumps(MODEL_TRAINING))  # the UI stores JSON strings
DEFAULT_MODE_SCRIPT = (f"<script>try{{if(localStorage.getItem({_KEY})===null)"
                       f"{{localStorage.setItem({_KEY},{_VALUE})}}}}catch(e){{}}</script>")

__all__ = ["app", "with_model_training_default"]


def with_model_training_default(response: Response) -> Response:
    """The UI's page with the default-mode script first in its head; every other response as it was."""
    if request.endpoint != "serve" or response.status_code != 200 or response.mimetype != "text/html":
        return response
    response.direct_passthrough = False  # a file response: read its body to rewrite it
    response.set_data(response.get_data(as_text=True).replace("<head>", "<head>" + DEFAULT_MODE_SCRIPT, 1))
    return response


flask_app.after_request(with_model_training_default)
