"""Schedules: agents run on a cron expression, exactly one run per tick for the whole fleet."""
