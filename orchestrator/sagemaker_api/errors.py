"""AWS errors in the JSON 1.1 protocol's shape, as botocore parses them.

A failed call answers an HTTP 4xx/5xx whose body is `{"__type": CODE, "message": TEXT}` with the
same code in the `x-amzn-ErrorType` header; botocore takes the code from `__type` and raises the
client's modeled exception of that name (`client.exceptions.ResourceInUse`, ...) or a plain
`ClientError` carrying it. The codes below are the ones SageMaker, CloudWatch Logs and AWS's
common authentication layer send.
"""

from __future__ import annotations

import json

CONTENT_TYPE = "application/x-amz-json-1.1"

# Authentication (AWS's common errors for JSON services).
MISSING_AUTHENTICATION_TOKEN = "MissingAuthenticationTokenException"
INCOMPLETE_SIGNATURE = "IncompleteSignatureException"
UNRECOGNIZED_CLIENT = "UnrecognizedClientException"
INVALID_SIGNATURE = "InvalidSignatureException"
ACCESS_DENIED = "AccessDeniedException"
THROTTLING = "ThrottlingException"
# The request itself.
UNKNOWN_OPERATION = "UnknownOperationException"
SERIALIZATION = "SerializationException"
VALIDATION = "ValidationException"
INTERNAL_FAILURE = "InternalFailure"
# SageMaker's modeled errors.
RESOURCE_IN_USE = "ResourceInUse"
RESOURCE_NOT_FOUND = "ResourceNotFound"
RESOURCE_LIMIT_EXCEEDED = "ResourceLimitExceeded"
# CloudWatch Logs' modeled errors.
LOGS_RESOURCE_NOT_FOUND = "ResourceNotFoundException"
INVALID_PARAMETER = "InvalidParameterException"  # a bad input to FilterLogEvents

# SageMaker answers a name it does not know with this ValidationException, not ResourceNotFound
# (aws/aws-sdk#165); boto3's waiters and the SDKs expect exactly that.
NOT_FOUND_MESSAGE = "Requested resource not found."


class AwsError(Exception):
    """An error answer: its code (`__type`), message and HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def body(self) -> bytes:
        return json.dumps({"__type": self.code, "message": self.message}).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"x-amzn-errortype", self.code.encode())]


def validation(message: str) -> AwsError:
    return AwsError(VALIDATION, message)


def not_found() -> AwsError:
    return AwsError(VALIDATION, NOT_FOUND_MESSAGE)


def invalid_parameter(message: str) -> AwsError:
    return AwsError(INVALID_PARAMETER, message)
