"""Names the SageMaker-compatible endpoint shares with its clients and with the node agent.

Tags a CreateTrainingJob request may carry to steer Aerie (everything else about a request is
SageMaker's own contract); the CloudWatch Logs group the SDKs read a job's output from; and the
node agent's heartbeat fields that say it is uploading the model (DescribeTrainingJob's
`Uploading` secondary status); and SageMaker's status words, typed once.
"""

from __future__ import annotations

from aerie_contracts._strenum import StrEnum

BACKEND_TAG = "aerie:backend"  # which Aerie backend runs the job (default: AERIE_DEFAULT_BACKEND)
HEALTH_TAG = "aerie:health"  # JSON of the spec's health overrides, e.g. {"hang_floor_s": 60}
TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"  # SageMaker's log group for training jobs

# In a node's heartbeat summary: what the node does after its ranks exited, and since when.
PHASE = "phase"
PHASE_SINCE = "phase_since"
PHASE_UPLOADING = "uploading"


class TrainingJobStatus(StrEnum):
    """SageMaker's TrainingJobStatus: what DescribeTrainingJob answers, ListTrainingJobs filters by,
    and the SageMaker backend reads back (Aerie's JobState shares the ended words)."""

    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    DELETING = "Deleting"  # never an Aerie job's: ListTrainingJobs' StatusEquals accepts it, matching none


class SecondaryStatus(StrEnum):
    """SageMaker's SecondaryStatus (the step of a training job): the endpoint's transitions are
    written in these words and the SageMaker backend reads a real job's in them."""

    STARTING = "Starting"
    PENDING = "Pending"
    LAUNCHING_ML_INSTANCES = "LaunchingMLInstances"
    PREPARING_TRAINING_STACK = "PreparingTrainingStack"
    DOWNLOADING = "Downloading"
    DOWNLOADING_TRAINING_IMAGE = "DownloadingTrainingImage"
    TRAINING = "Training"
    UPLOADING = "Uploading"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    MAX_RUNTIME_EXCEEDED = "MaxRuntimeExceeded"
    MAX_WAIT_TIME_EXCEEDED = "MaxWaitTimeExceeded"
    COMPLETED = "Completed"
    FAILED = "Failed"
    INTERRUPTED = "Interrupted"
    UPDATING = "Updating"
    RESTARTING = "Restarting"
