"""The prediction server (``recserve serve``): transports/ over one dataplane/, run by operations/."""
