"""The call-center simulator behind ``asr-client load``: calls, runner, report."""
