"""Storage: the only code that touches boto3 (DynamoDB, S3, SQS; KMS for the secret box, Secrets Manager)."""
