"""`Box(ray.put(data))`: slime's way of handing a batch's object reference through an actor
call without Ray resolving it on the way (the trainer fetches it where it needs it)."""


class Box:
    def __init__(self, inner):
        self.inner = inner
