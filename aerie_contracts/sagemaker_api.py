"""Names the SageMaker-compatible endpoint shares with its clients and with the node agent.

Tags a CreateTrainingJob request may carry to steer Aerie (everything else about a request is
SageMaker's own contract); the CloudWatch Logs group the SDKs read a job's output from; and the
node agent's heartbeat fields that say it is uploading the model (DescribeTrainingJob's
`Uploading` secondary status).
"""

from __future__ import annotations

BACKEND_TAG = "aerie:backend"  # which Aerie backend runs the job (default: AERIE_DEFAULT_BACKEND)
HEALTH_TAG = "aerie:health"  # JSON of the spec's health overrides, e.g. {"hang_floor_s": 60}
TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"  # SageMaker's log group for training jobs

# In a node's heartbeat summary: what the node does after its ranks exited, and since when.
PHASE = "phase"
PHASE_SINCE = "phase_since"
PHASE_UPLOADING = "uploading"
