"""The allocator: pure DRF, quota, filters and gang offers; time is an argument."""
