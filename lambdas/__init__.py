"""Event handlers with the AWS Lambda signature `handler(event, context)`.

Torch-free and dependency-light (standard library + boto3, which the Lambda runtime ships), so the
same files deploy to AWS Lambda behind EventBridge rules and run in-process under `aerie up`.
"""
