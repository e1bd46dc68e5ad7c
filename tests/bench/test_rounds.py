from benchmarks.rounds import rotated


def test_each_item_goes_first_once_in_as_many_rounds_as_items():
    items = ["a", "b", "c"]
    orders = [rotated(items, r) for r in range(7)]
    assert [o[0] for o in orders[:3]] == items
    assert all(sorted(o) == items for o in orders)  # every round runs each item once
    assert orders[3] == orders[0] and orders[4] == ["b", "c", "a"]
    assert rotated([], 5) == []
