"""Operations across the stages (store -> format -> archive -> query): status, verify, restore."""
