"""The SageMaker-compatible endpoint: SageMaker's training API and the CloudWatch Logs calls the
SDKs read job logs with, spoken over AWS's JSON 1.1 protocol with SigV4, on top of Aerie's jobs.

`gateway` (the ASGI door and authentication flow), `sigv4` (credentials, verification),
`training` (CreateTrainingJob & co.), `logs` (DescribeLogStreams, GetLogEvents), `errors`.
What the protocol carries is decided beside it, once: the spec <-> request field table in
`orchestrator/sagemaker_mapping.py`, what a request becomes on a backend in
`orchestrator/sagemaker_api/admission.py`, the Describe/List answers in `orchestrator/sagemaker_answers.py`.
"""
